package localcluster

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func inode(t *testing.T, path string) (uint64, int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino, fi.ModTime().UnixNano()
}

// Every node's kwok reads the stage files when it starts, and the nodes of
// a cluster start one after the other: writing them again for the next
// node must never change a file under a kwok that is reading it (N1: a
// node whose kwok loaded a truncated pod-ready stage never ran a pod).
func TestWriteStages_N1_AStartingNodeNeverRewritesAFileAnotherKwokReads(t *testing.T) {
	dir := t.TempDir()
	paths, err := writeStages(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("writeStages wrote no stage")
	}
	want, err := podStages.ReadFile("stages/" + filepath.Base(paths[0]))
	if err != nil {
		t.Fatal(err)
	}

	// The next node's start: files that already hold their text are not
	// touched at all.
	ino, mtime := inode(t, paths[0])
	if _, err := writeStages(dir); err != nil {
		t.Fatal(err)
	}
	if ino2, mtime2 := inode(t, paths[0]); ino2 != ino || mtime2 != mtime {
		t.Errorf("%s was written again although it held its text (inode %d -> %d, mtime %d -> %d)", paths[0], ino, ino2, mtime, mtime2)
	}

	// A file with other text is replaced, not rewritten in place: a reader
	// that opened it before still reads the whole old text.
	stale := []byte("# an older harness's stage\n")
	if err := os.WriteFile(paths[0], stale, 0o644); err != nil {
		t.Fatal(err)
	}
	reader, err := os.Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if _, err := writeStages(dir); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(reader)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(stale) {
		t.Errorf("a reader that opened %s before the write read %q, want the whole old text %q (the file was rewritten in place)", paths[0], got, stale)
	}
	now, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	if string(now) != string(want) {
		t.Errorf("%s holds %q after writeStages, want the embedded stage", paths[0], now)
	}
	left, err := filepath.Glob(filepath.Join(dir, "stages", ".*"))
	if err != nil || len(left) != 0 {
		t.Errorf("temporary files left behind: %v %v", left, err)
	}
}
