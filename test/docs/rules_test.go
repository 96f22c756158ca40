package readme

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/refresh"
)

// ruleCite is a rule ID as code and docs cite it: an upper-case family
// letter and a number (R7, B1, C6). API versions ("v1", "apps/v1") are
// lower case and do not match.
var ruleCite = regexp.MustCompile(`\b(R|B|C|D|N|V|O|K|P|S)[0-9]{1,2}\b`)

// ruleAnchors reads the anchors of docs/rules.md: <a id="r7"></a>.
func ruleAnchors(t *testing.T, dir string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "docs", "rules.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`<a id="([a-z][0-9]{1,2})"></a>`).FindAllStringSubmatch(string(b), -1) {
		if anchors[m[1]] {
			t.Errorf("docs/rules.md: anchor %q twice", m[1])
		}
		anchors[m[1]] = true
	}
	return anchors
}

// TestRules_EveryCitedIDHasAnAnchor: every rule ID that the Go code (its
// comments, strings and test names), the docs or the chart cite is
// explained under its own anchor in docs/rules.md, so that a reader of any
// of them can look it up.
func TestRules_EveryCitedIDHasAnAnchor(t *testing.T) {
	dir := root(t)
	anchors := ruleAnchors(t, dir)
	cited := map[string][]string{} // ID → the first files citing it
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(p, ".go"),
			strings.HasSuffix(p, ".md") && (rel == "README.md" || strings.HasPrefix(rel, "docs/")),
			strings.HasPrefix(rel, "charts/"):
		default:
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, id := range ruleCite.FindAllString(string(b), -1) {
			if len(cited[id]) < 3 && (len(cited[id]) == 0 || cited[id][len(cited[id])-1] != rel) {
				cited[id] = append(cited[id], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scan itself: the code cites these on every line of its history.
	for _, id := range []string{"R1", "R7", "B1", "C6", "D1", "N1", "V1", "O1"} {
		if cited[id] == nil {
			t.Fatalf("the scan found no citation of %s (found %d IDs); it is broken", id, len(cited))
		}
	}
	ids := make([]string, 0, len(cited))
	for id := range cited {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if !anchors[strings.ToLower(id)] {
			t.Errorf("%s is cited (%s) but docs/rules.md has no anchor %q for it", id, strings.Join(cited[id], ", "), strings.ToLower(id))
		}
	}
	t.Logf("%d rule IDs cited, %d anchors in docs/rules.md", len(ids), len(anchors))
}

// TestRules_LinksExist: every relative link of docs/rules.md names a file
// of the repository, and every state of the engine's state table
// (refresh.States) has its page under docs/states/.
func TestRules_LinksExist(t *testing.T) {
	dir := root(t)
	b, err := os.ReadFile(filepath.Join(dir, "docs", "rules.md"))
	if err != nil {
		t.Fatal(err)
	}
	links := regexp.MustCompile(`\]\(([^)\s#]*)(#[^)\s]*)?\)`).FindAllStringSubmatch(string(b), -1)
	if len(links) < 20 {
		t.Fatalf("found only %d links in docs/rules.md; the extraction is broken", len(links))
	}
	for _, m := range links {
		if m[1] == "" || strings.Contains(m[1], "://") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "docs", m[1])); err != nil {
			t.Errorf("docs/rules.md links %s, which does not exist", m[1])
		}
	}
	for _, s := range refresh.States() {
		if _, err := os.Stat(filepath.Join(dir, "docs", "states", string(s)+".md")); err != nil {
			t.Errorf("state %s has no page docs/states/%s.md", s, s)
		}
	}
}
