package testkit

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Listening returns the listening TCP (v4 and v6) sockets among pid's open
// files, by inode, and the paths of its listening Unix sockets, as Linux's
// /proc shows them.
func Listening(t testing.TB, pid int) (tcp, unix []string) {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			mine[strings.TrimSuffix(inode, "]")] = true
		}
	}
	for _, table := range []string{"tcp", "tcp6", "unix"} {
		raw, err := os.ReadFile("/proc/net/" + table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			switch {
			case table == "unix" && len(f) >= 8 && f[3] == "00010000" && mine[f[6]]: // __SO_ACCEPTCON
				unix = append(unix, f[7])
			case table != "unix" && len(f) >= 10 && f[3] == "0A" && mine[f[9]]: // TCP_LISTEN
				tcp = append(tcp, f[9])
			}
		}
	}
	return tcp, unix
}
