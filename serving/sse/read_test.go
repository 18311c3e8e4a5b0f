package sse

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// readAll reads events until an error and returns them with the error and
// the bytes of an incomplete last event.
func readAll(br *bufio.Reader) (evs []string, tail string, err error) {
	var buf []byte
	for {
		ev, err := ReadEvent(br, buf)
		if err != nil {
			return evs, string(ev), err
		}
		evs = append(evs, string(ev))
		buf = ev
	}
}

func TestReadEvent(t *testing.T) {
	long := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("x", 70<<10) + "\"}}]}"
	tests := []struct {
		name   string
		stream string
		want   []string
		tail   string
	}{
		{"events verbatim",
			": keep-alive\n\ndata: {\"a\":1}\n\ndata: [DONE]\n\n",
			[]string{": keep-alive\n\n", "data: {\"a\":1}\n\n", "data: [DONE]\n\n"}, ""},
		{"CRLF line endings",
			"data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n",
			[]string{"data: {\"a\":1}\r\n\r\n", "data: [DONE]\r\n\r\n"}, ""},
		{"stray blank lines skipped",
			"\n\r\ndata: a\n\n\n\ndata: b\n\n\r\n",
			[]string{"data: a\n\n", "data: b\n\n"}, ""},
		{"several lines in one event",
			": c\nid: 1\ndata: a\ndata: b\n\n",
			[]string{": c\nid: 1\ndata: a\ndata: b\n\n"}, ""},
		{"a line longer than 64 KiB",
			long + "\n\ndata: [DONE]\n\n",
			[]string{long + "\n\n", "data: [DONE]\n\n"}, ""},
		{"a long CRLF line",
			long + "\r\n\r\ndata: [DONE]\r\n\r\n",
			[]string{long + "\r\n\r\n", "data: [DONE]\r\n\r\n"}, ""},
		{"incomplete last event comes with EOF",
			"data: a\n\ndata: [DONE]\n",
			[]string{"data: a\n\n"}, "data: [DONE]\n"},
		{"incomplete last line comes with EOF",
			"data: a\n\ndata: {\"cho",
			[]string{"data: a\n\n"}, "data: {\"cho"},
		{"clean end", "data: a\n\n", []string{"data: a\n\n"}, ""},
		{"nothing", "", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, size := range []int{16, 17, 31, 64, 16 << 10} {
				for _, one := range []bool{false, true} {
					var r io.Reader = strings.NewReader(tt.stream)
					if one {
						r = iotest.OneByteReader(r)
					}
					evs, tail, err := readAll(bufio.NewReaderSize(r, size))
					if !errors.Is(err, io.EOF) {
						t.Fatalf("size %d: err = %v, want io.EOF", size, err)
					}
					if strings.Join(evs, "|") != strings.Join(tt.want, "|") || tail != tt.tail {
						t.Fatalf("size %d, one byte %v:\ngot  %q tail %q\nwant %q tail %q",
							size, one, shortAll(evs), short(tail), shortAll(tt.want), short(tt.tail))
					}
				}
			}
		})
	}
}

// TestReadEventLineEndAtBufferEdge pins the case a naive reader gets wrong:
// a line exactly as long as the buffer, whose "\n" (or the "\n" of its
// "\r\n") arrives in the next read, must not end the event.
func TestReadEventLineEndAtBufferEdge(t *testing.T) {
	const size = 32
	for _, eol := range []string{"\n", "\r\n"} {
		for n := size - 3; n <= size+2; n++ {
			line := "data: " + strings.Repeat("y", n-len("data: "))
			stream := line + eol + ": more" + eol + eol + "data: [DONE]" + eol + eol
			evs, _, err := readAll(bufio.NewReaderSize(strings.NewReader(stream), size))
			want := []string{line + eol + ": more" + eol + eol, "data: [DONE]" + eol + eol}
			if !errors.Is(err, io.EOF) || strings.Join(evs, "|") != strings.Join(want, "|") {
				t.Errorf("line of %d bytes, eol %q: got %q, %v", n, eol, evs, err)
			}
		}
	}
}

func TestReadEventReturnsTheReadError(t *testing.T) {
	boom := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom))
	evs, tail, err := readAll(bufio.NewReaderSize(r, 16))
	if !errors.Is(err, boom) || len(evs) != 1 || tail != "data: b" {
		t.Errorf("got %q tail %q err %v, want one event, tail \"data: b\", %v", evs, tail, err, boom)
	}
}

func TestReadEventReusesBuf(t *testing.T) {
	stream := strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 100)
	br := bufio.NewReader(strings.NewReader(stream))
	buf := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(50, func() {
		ev, err := ReadEvent(br, buf)
		if err != nil {
			t.Fatal(err)
		}
		buf = ev
	})
	if allocs != 0 {
		t.Errorf("ReadEvent allocates %v times per event with a big enough buf", allocs)
	}
}

func TestNextBuffered(t *testing.T) {
	tests := []struct {
		name     string
		buffered string
		want     bool
	}{
		{"nothing", "", false},
		{"half an event", "data: {\"cho", false},
		{"a line without its blank line", "data: x\n", false},
		{"a whole event", "data: x\n\n", true},
		{"a whole event and more", "data: x\n\ndata: y", true},
		{"a whole CRLF event", "data: x\r\n\r\n", true},
		{"a CRLF line without its blank line", "data: x\r\n", false},
		{"a whole comment", ": keep-alive\n\n", true},
		{"stray blank lines and half an event", "\n\r\n\ndata: x\n", false},
		{"stray blank lines only", "\n\n\r\n", false},
		{"stray blank line and a whole event", "\ndata: x\n\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tt.buffered))
			_, _ = br.Peek(len(tt.buffered)) // buffer it all, as a network read would
			if br.Buffered() != len(tt.buffered) {
				t.Fatalf("buffered %d of %d", br.Buffered(), len(tt.buffered))
			}
			if got := NextBuffered(br); got != tt.want {
				t.Errorf("NextBuffered(%q) = %v, want %v", tt.buffered, got, tt.want)
			}
		})
	}
}

// TestNextBufferedNeverPromisesABlockingRead reads a stream that arrives in
// pieces: whenever NextBuffered says yes, the next ReadEvent must not need
// another read from the connection.
func TestNextBufferedNeverPromisesABlockingRead(t *testing.T) {
	stream := "data: a\n\n\ndata: b\r\n\r\n: c\n\ndata: " + strings.Repeat("z", 100) + "\n\ndata: [DONE]\n\n"
	for chunk := 1; chunk <= len(stream); chunk++ {
		cr := &countingReader{r: iotest.HalfReader(&chunkReader{s: stream, n: chunk})}
		br := bufio.NewReaderSize(cr, 64)
		var buf []byte
		for {
			promised := NextBuffered(br)
			before := cr.reads
			ev, err := ReadEvent(br, buf)
			if err != nil {
				break
			}
			if promised && cr.reads != before {
				t.Fatalf("chunk %d: NextBuffered said yes, but reading %q needed the connection", chunk, ev)
			}
			buf = ev
		}
	}
}

type chunkReader struct {
	s string
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[n:]
	return n, nil
}

type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

func FuzzReadEvent(f *testing.F) {
	f.Add([]byte("data: a\n\n\r\n: b\r\n\r\ndata: c"), uint8(0))
	f.Add([]byte(strings.Repeat("x", 40)+"\r\n\r\n\n"), uint8(3))
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		br := bufio.NewReaderSize(bytes.NewReader(stream), 16+int(size))
		evs, tail, err := readAll(br)
		if !errors.Is(err, io.EOF) {
			t.Fatalf("err = %v", err)
		}
		// Reference: split into lines, drop blank lines that start no event.
		var want []string
		var cur strings.Builder
		s := string(stream)
		for s != "" {
			line := s
			if i := strings.IndexByte(s, '\n'); i >= 0 {
				line = s[:i+1]
			}
			s = s[len(line):]
			blank := line == "\n" || line == "\r\n"
			if blank && cur.Len() == 0 {
				continue
			}
			cur.WriteString(line)
			if blank {
				want = append(want, cur.String())
				cur.Reset()
			}
		}
		if strings.Join(evs, "\x00") != strings.Join(want, "\x00") || tail != cur.String() {
			t.Fatalf("got %q tail %q, want %q tail %q", evs, tail, want, cur.String())
		}
		for _, ev := range evs {
			Classify([]byte(ev)) // must not panic
			Pieces(Data([]byte(ev)))
		}
	})
}

func shortAll(evs []string) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = short(ev)
	}
	return out
}
