package commitlog

import (
	"errors"
	"os"
	"syscall"
)

// File systems whose fallocate(2) reserves the blocks, so that a store into
// a mapped page of the preallocated range cannot fail for space (no SIGBUS
// on a full disk): ext4, XFS, tmpfs. On others (btrfs and ZFS copy on
// write, so space is only taken at writeback; NFS, FUSE, overlayfs: it
// depends on what is below) the log keeps one write(2) a group.
var mappable = map[int64]bool{
	0xEF53:     true, // ext2/3/4
	0x58465342: true, // XFS
	0x01021994: true, // tmpfs
}

// canMap reports whether appends to files in f's file system may go through
// a shared memory map of a preallocated file.
func canMap(f *os.File) bool {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	return mappable[int64(st.Type)]
}

// errNoPrealloc says the file system does not preallocate (EOPNOTSUPP):
// append with write(2).
var errNoPrealloc = errors.New("commit log: file system cannot preallocate")

// preallocate gives f size bytes of blocks (fallocate mode 0: the file's
// size becomes size, its bytes zeros) and maps them shared and writable.
// ENOSPC, or any other refusal of the space, comes from here, before a
// record relies on it.
func preallocate(f *os.File, size int) ([]byte, error) {
	fd := int(f.Fd())
	if err := syscall.Fallocate(fd, 0, 0, int64(size)); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return nil, errNoPrealloc
		}
		return nil, &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
	}
	m, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: f.Name(), Err: err}
	}
	return m, nil
}

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14): fault the pages in
// writable, as a store would, without storing.
const madvPopulateWrite = 23

// populate faults m's pages in writable with one system call instead of a
// page fault each on the first store. It only saves work: an error (an
// older kernel) is ignored, and the stores fault the pages in themselves.
func populate(m []byte) bool {
	return syscall.Madvise(m, madvPopulateWrite) == nil
}

func unmap(m []byte) { _ = syscall.Munmap(m) }
