//go:build !linux

package commitlog

import (
	"errors"
	"os"
)

// Off Linux the log appends with one write(2) a group.

func canMap(*os.File) bool { return false }

var errNoPrealloc = errors.New("commit log: file system cannot preallocate")

func preallocate(*os.File, int) ([]byte, error) { return nil, errNoPrealloc }

func populate([]byte) bool { return false }

func unmap([]byte) {}
