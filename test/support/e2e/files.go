package e2e

import (
	"os"
	"testing"
)

// ReadFile is the content of path; the test fails if it cannot be read.
func ReadFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
