-- An approval binds the worker that asked: the approval code it printed
-- (serving.ApprovalCode of the key it sends while it has no credential).
-- asked_code is the code of the last refused request, shown to the
-- operator beside its source address (source: the address the request
-- came from, which caps the pending ids one source may leave).
ALTER TABLE worker_admissions ADD COLUMN approved_code TEXT NOT NULL DEFAULT '';
ALTER TABLE worker_admissions ADD COLUMN asked_code TEXT NOT NULL DEFAULT '';
ALTER TABLE worker_admissions ADD COLUMN source TEXT NOT NULL DEFAULT '';
