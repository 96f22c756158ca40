package localcluster

import (
	"bytes"
	"embed"
	"errors"
	"os"
	"path/filepath"
)

// podStages are the harness's own pod Stage documents, kwok's with the
// changes a kubelet makes necessary: a pod starts once the node agent has
// reported its image IDs (which starting and completing keep), and its
// Ready condition follows its readiness gates, which their owners set
// (pod-ready, pod-readiness): also when its node comes back.
//
//go:embed stages/*.yaml
var podStages embed.FS

// writeStages copies podStages into runDir/stages and returns their paths.
//
// Every node's kwok reads these files when it starts, and the nodes start
// one after the other: a file is therefore never rewritten in place. One
// that already holds the right text is left alone, and any other is
// written to a temporary file and renamed over, so a kwok that is reading
// one sees either the whole old text or the whole new one. (An in-place
// rewrite truncated the file under the kwok of the node started just
// before: that kwok loaded no pod-ready stage, and every pod sent to its
// node stayed Pending.)
func writeStages(runDir string) ([]string, error) {
	dir := filepath.Join(runDir, "stages")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	entries, err := podStages.ReadDir("stages")
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range entries {
		b, err := podStages.ReadFile("stages/" + e.Name())
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, e.Name())
		if err := writeFileAtomic(p, b); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// writeFileAtomic makes path hold b: nothing is written when it already
// does, otherwise b goes to a temporary file in the same directory that is
// renamed over path.
func writeFileAtomic(path string, b []byte) error {
	old, err := os.ReadFile(path)
	if err == nil && bytes.Equal(old, b) {
		return nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
