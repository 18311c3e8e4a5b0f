package load

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// A link carries bytes both ways whole and in order, though each chunk
// is held its own jittered delay; once closed it cuts the connections it
// carries and refuses new ones, as a dead region's address does.
func TestLinkKeepsOrderAndRefusesOnceClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	l, err := newLink(ln.Addr().String(), 2*time.Millisecond, 2*time.Millisecond, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.ln.Addr().String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sent bytes.Buffer
	for i := range 300 {
		fmt.Fprintf(&sent, "chunk %04d;", i)
	}
	go func() {
		for b := sent.Bytes(); len(b) > 0; b = b[min(11, len(b)):] {
			if _, err := c.Write(b[:min(11, len(b))]); err != nil {
				return
			}
		}
	}()
	got := make([]byte, sent.Len())
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %d bytes: %v", sent.Len(), err)
	}
	if !bytes.Equal(got, sent.Bytes()) {
		t.Fatalf("echo through the link differs from what was sent:\n%s", got[:80])
	}
	if n := l.opened.Load(); n != 1 {
		t.Fatalf("link counted %d connections, want 1", n)
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection the closed link carried still reads")
	}
	if c2, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c2.Close()
		t.Fatal("the closed link still accepts connections")
	}
}
