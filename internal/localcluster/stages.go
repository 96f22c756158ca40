package localcluster

import (
	"embed"
	"os"
	"path/filepath"
)

// podStages are the harness's own pod Stage documents, kwok's with two
// changes a kubelet makes necessary: a pod starts once the node agent has
// reported its image IDs (which starting and completing keep), and a
// running pod is Ready again when its node comes back (pod-ready-again).
//
//go:embed stages/*.yaml
var podStages embed.FS

// writeStages copies podStages into runDir/stages and returns their paths.
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
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}
