package batch

import (
	"errors"
	"fmt"
	"time"
)

// Config configures the Batch API and its executor. The zero value is a
// Batch API that is off: its routes answer 501 and Run returns at once.
// Every other zero value means the default named beside the field.
type Config struct {
	// FilesDir holds the bodies of uploaded and generated files, one file
	// per id. Empty turns the Batch API off.
	FilesDir string
	// MaxFileBytes bounds an uploaded file; larger uploads get 413.
	// 0 means 100 MiB.
	MaxFileBytes int64
	// MaxFileLines bounds the requests (non-blank lines) of an input file,
	// as OpenAI does; an upload with more gets 400 naming the first line
	// past the limit. 0 means 50,000.
	MaxFileLines int
	// MaxLineBytes bounds one line of an input file (without its newline);
	// an upload with a longer line gets 400 naming it. The executor holds a
	// few copies of each line it runs (Concurrency lines at once), so this
	// bounds its memory. 0 means 1 MiB: a prompt of some 250,000 tokens of
	// text, more than the context of the models served here.
	MaxLineBytes int64
	// TenantStorageBytes bounds the bytes of all of a tenant's files,
	// uploads and result files alike; an upload that does not fit gets 400
	// saying what is used of how much. Result files are always written
	// (they hold answers already billed) and may take a tenant past it;
	// deleting or expiring files frees it. 0 means 1 GiB.
	TenantStorageBytes int64
	// FileExpiry is how long an uploaded file, and a batch's output and
	// error files, are kept after their creation unless the client asks
	// otherwise (expires_after, output_expires_after: 1 hour to 30 days).
	// Expired files answer 404 and are removed by Run. A batch's input
	// file stays until the batch finishes. 0 means 30 days.
	FileExpiry time.Duration
	// MaxBodyBytes bounds the JSON body of POST /v1/batches; larger bodies
	// get 413. 0 means 4 MiB.
	MaxBodyBytes int64
	// Concurrency bounds the lines in flight across all batches; 0 means 32.
	Concurrency int
	// TenantConcurrency bounds one tenant's lines in flight; 0 means 8. A
	// key's MaxConcurrency, when lower, bounds the lines of its batches.
	TenantConcurrency int
	// PollInterval is how often the executor looks for new, cancelled and
	// expired batches and re-reads the owner's key; 0 means 500ms. A batch
	// created through the API does not wait for it: the executor is woken.
	PollInterval time.Duration
	// DrainTimeout is how long Run lets the lines in flight finish once its
	// context is done before it cancels them. A cancelled line is not
	// recorded, so it runs again after a restart. 0 means 10s; negative
	// cancels them at once.
	DrainTimeout time.Duration
	// ProgressInterval is how often a running batch logs its progress;
	// 0 means 10s.
	ProgressInterval time.Duration
	// RetryWait is the wait before retrying a line that failed upstream (a
	// 5xx), doubled per retry; a line is retried at most twice. 0 means 1s.
	RetryWait time.Duration
	// BodyTimeout bounds reading the body of POST /v1/batches, and the
	// start of an upload, so a client that trickles its body cannot hold a
	// handler: it gets 408. 0 means 30s (the public API's default).
	BodyTimeout time.Duration
	// IdempotencyRetention is how long POST /v1/batches keeps its answer
	// for a retry with the same Idempotency-Key; 0 means 24h.
	IdempotencyRetention time.Duration
	// UploadMinRate is the slowest an upload may arrive, in bytes per
	// second, after its first BodyTimeout: an upload of n bytes may take
	// BodyTimeout + n/UploadMinRate, and never more than UploadTimeout.
	// Slower uploads get 408. 0 means 64 KiB/s (100 MiB in 27 minutes
	// beyond the first 30s — so UploadTimeout binds first for large files).
	UploadMinRate int64
	// UploadTimeout bounds reading one upload; 0 means 10m.
	UploadTimeout time.Duration
	// Now is the clock that decides when a batch's completion window has
	// passed and when a file expires; nil means time.Now.
	Now func() time.Time
}

// Validate reports a setting that has no meaning: a negative size, count
// or interval (only DrainTimeout may be negative).
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxFileBytes", c.MaxFileBytes}, {"MaxBodyBytes", c.MaxBodyBytes},
		{"Concurrency", int64(c.Concurrency)}, {"TenantConcurrency", int64(c.TenantConcurrency)},
		{"PollInterval", int64(c.PollInterval)}, {"ProgressInterval", int64(c.ProgressInterval)},
		{"RetryWait", int64(c.RetryWait)}, {"UploadTimeout", int64(c.UploadTimeout)},
		{"MaxFileLines", int64(c.MaxFileLines)}, {"MaxLineBytes", c.MaxLineBytes},
		{"TenantStorageBytes", c.TenantStorageBytes}, {"FileExpiry", int64(c.FileExpiry)},
		{"BodyTimeout", int64(c.BodyTimeout)}, {"UploadMinRate", c.UploadMinRate},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("batch: %s must not be negative", f.name))
		}
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.IdempotencyRetention <= 0 {
		c.IdempotencyRetention = 24 * time.Hour
	}
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = 100 << 20
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.Concurrency == 0 {
		c.Concurrency = 32
	}
	if c.TenantConcurrency == 0 {
		c.TenantConcurrency = 8
	}
	if c.PollInterval == 0 {
		c.PollInterval = 500 * time.Millisecond
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = 10 * time.Second
	}
	if c.RetryWait == 0 {
		c.RetryWait = time.Second
	}
	if c.UploadTimeout == 0 {
		c.UploadTimeout = 10 * time.Minute
	}
	if c.MaxFileLines == 0 {
		c.MaxFileLines = 50_000
	}
	if c.MaxLineBytes == 0 {
		c.MaxLineBytes = 1 << 20
	}
	if c.TenantStorageBytes == 0 {
		c.TenantStorageBytes = 1 << 30
	}
	if c.FileExpiry == 0 {
		c.FileExpiry = 30 * 24 * time.Hour
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = 30 * time.Second
	}
	if c.UploadMinRate == 0 {
		c.UploadMinRate = 64 << 10
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
