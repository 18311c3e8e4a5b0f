package load

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// output prints the report(s) and writes the files asked for: one report,
// or two side by side with their comparison.
func (b *bench) output(reports []*Report) error {
	o := &b.opts
	var out strings.Builder
	if len(reports) == 1 {
		_ = reports[0].WriteText(&out)
	} else {
		for _, r := range reports {
			_ = r.WriteBrief(&out)
			out.WriteByte('\n')
		}
		_ = Compare(reports[0], reports[1]).WriteText(&out)
	}
	if _, err := io.WriteString(o.Stdout, out.String()); err != nil {
		return err
	}
	var errs []error
	if o.JSONFile != "" {
		var v any = reports[0]
		if len(reports) == 2 {
			v = Compare(reports[0], reports[1])
		}
		raw, err := json.MarshalIndent(v, "", " ")
		if err == nil {
			err = os.WriteFile(o.JSONFile, append(raw, '\n'), 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--json: %w", err))
		} else {
			fmt.Fprintf(o.Stderr, "bench: wrote %s\n", o.JSONFile)
		}
	}
	if o.HTMLFile != "" {
		err := writeFileWith(o.HTMLFile, func(w io.Writer) error { return WriteHTML(w, reports...) })
		if err != nil {
			errs = append(errs, fmt.Errorf("--html: %w", err))
		} else {
			abs, _ := filepath.Abs(o.HTMLFile)
			fmt.Fprintf(o.Stderr, "bench: wrote %s (open file://%s)\n", o.HTMLFile, abs)
		}
	}
	return errors.Join(errs...)
}

func writeFileWith(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}
