package data

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// fillRow sets every field of v (a struct, through reflection) to a value
// of its own that is not the zero value, so a field appendRecord forgets
// comes back zero.
func fillRow(t *testing.T, v reflect.Value, seed *int) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		*seed++
		switch {
		case f.Type() == reflect.TypeFor[time.Time]():
			f.Set(reflect.ValueOf(time.Date(2026, 11, 30, 23, 4, 5, 123456789+*seed, time.UTC)))
		case f.Kind() == reflect.String:
			f.SetString(v.Type().Field(i).Name + " \"quoted\" \\ back\nline\ttab \x01 <html> & é 語")
		case f.Kind() == reflect.Bool:
			f.SetBool(true)
		case f.CanInt():
			f.SetInt(int64(*seed) * -7919)
		case f.Kind() == reflect.Struct:
			fillRow(t, f, seed)
		case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Struct:
			f.Set(reflect.MakeSlice(f.Type(), 2, 2))
			fillRow(t, f.Index(0), seed)
			fillRow(t, f.Index(1), seed)
		default:
			t.Fatalf("fillRow: field %s of kind %s: teach fillRow and appendRecord about it", v.Type().Field(i).Name, f.Kind())
		}
	}
}

// A commit-log record decodes to the row it was made of, field for field,
// exactly as encoding/json's encoding of the row does: a field added to
// LedgerRow (or Stages, or Attempt) that appendRecord does not write fails
// here instead of vanishing from rows recovered after a kill.
func TestCommitRecordKeepsEveryFieldOfTheRow(t *testing.T) {
	var row LedgerRow
	seed := 0
	fillRow(t, reflect.ValueOf(&row).Elem(), &seed)
	for _, r := range []LedgerRow{row, {}, {ID: "only-id", AttemptLog: []Attempt{}}} {
		rec := appendRecord(nil, &r)
		if !json.Valid(rec) {
			t.Fatalf("not JSON: %s", rec)
		}
		var got, want LedgerRow
		if err := json.Unmarshal(rec, &got); err != nil {
			t.Fatal(err)
		}
		std, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(std, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("record decodes to\n%+v\nencoding/json's to\n%+v", got, want)
		}
	}
}

// Any string — invalid UTF-8, control bytes, quotes — makes a valid record
// that decodes to what encoding/json's encoding of it decodes to.
func FuzzCommitRecordString(f *testing.F) {
	for _, s := range []string{"", "plain", "\"\\\n\r\t\x00\x1f\x7f", "\xff\xfe", "é語\u2028\u2029", "a\xc3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r := LedgerRow{ID: s, AttemptLog: []Attempt{{Reason: s}}}
		rec := appendRecord(nil, &r)
		var got, want LedgerRow
		if err := json.Unmarshal(rec, &got); err != nil {
			t.Fatalf("%q: %v in %s", s, err, rec)
		}
		std, _ := json.Marshal(r)
		if err := json.Unmarshal(std, &want); err != nil {
			t.Fatal(err)
		}
		if got.ID != want.ID || got.AttemptLog[0].Reason != want.AttemptLog[0].Reason {
			t.Fatalf("%q decodes to %q, encoding/json's to %q", s, got.ID, want.ID)
		}
	})
}

// BenchmarkCommitRecord: a typical answer's record, by hand and by
// encoding/json (the baseline it replaced).
func BenchmarkCommitRecord(b *testing.B) {
	r := LedgerRow{ID: "req_4238n2ip_1", Time: time.Now(), TenantID: 3, KeyID: "key_abc", Model: "tailgate-sim",
		Upstream: "sim-1", PromptTokens: 24, CompletionTokens: 16, CostMicros: 14, Status: 200, Outcome: OutcomeOK,
		Attempts: 1, Stages: UnknownStages(), AttemptLog: []Attempt{{N: 1, Replica: "sim-1", Role: "first", Outcome: AttemptWon, PromptTokens: 24, CompletionTokens: 16}},
		Priority: "standard", QueueWait: -1}
	b.Run("appendRecord", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendRecord(buf[:0], &r)
		}
		b.ReportMetric(float64(len(buf)), "bytes/record")
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(r)
		}
	})
}
