package cli

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// helpText is one piece of what `--help` prints: a command's Short, Long
// or Example, or a flag's usage.
type helpText struct {
	where, text string
}

// helpTexts walks the whole command tree NewRoot builds.
func helpTexts(root *cobra.Command) []helpText {
	var out []helpText
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		name := cmd.CommandPath()
		out = append(out, helpText{name + " Use", cmd.Use}, helpText{name + " Short", cmd.Short},
			helpText{name + " Long", cmd.Long}, helpText{name + " Example", cmd.Example})
		visit := func(f *pflag.Flag) { out = append(out, helpText{name + " --" + f.Name, f.Usage}) }
		cmd.LocalFlags().VisitAll(visit)
		cmd.PersistentFlags().VisitAll(visit)
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

// repoRoot is the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = filepath.Dir(dir)
	}
}

var (
	// A path a help text points the reader to: anything under docs/,
	// plugins/, charts/ or hack/, and any *.md file.
	helpPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:docs|plugins|charts|hack)/[A-Za-z0-9_./#-]*|[A-Za-z0-9_./-]+\.md(?:#[A-Za-z0-9_-]+)?)`)
	// A rule ID (R7, B1, …): users have no list of them in help, so a help
	// text says the plain thing and points to docs/ instead.
	ruleID = regexp.MustCompile(`\b(R|B|C|D|N|V|O|K|P|S)[0-9]{1,2}\b`)
)

// TestHelp_NamesOnlyFilesInTheRepo: every file or docs/ page that a help
// text names exists in the repository (a user has the repository, not our
// notes), no help text cites "SPEC" or a bare rule ID.
func TestHelp_NamesOnlyFilesInTheRepo(t *testing.T) {
	root := repoRoot(t)
	texts := helpTexts(NewRoot(io.Discard, io.Discard))
	checked := map[string]bool{}
	for _, h := range texts {
		if strings.Contains(h.text, "SPEC") || strings.Contains(strings.ToLower(h.text), "behaviour contract") {
			t.Errorf("%s cites a file users do not have: %q", h.where, h.text)
		}
		if ids := ruleID.FindAllString(h.text, -1); len(ids) > 0 {
			t.Errorf("%s cites rule IDs %v; say the plain thing and point to a docs/ page: %q", h.where, ids, h.text)
		}
		for _, m := range helpPath.FindAllStringSubmatch(h.text, -1) {
			p, _, _ := strings.Cut(strings.TrimRight(m[1], ".,;:"), "#")
			checked[p] = true
			if _, err := os.Stat(filepath.Join(root, p)); err != nil {
				t.Errorf("%s names %s, which is not in the repository: %q", h.where, m[1], h.text)
			}
		}
	}
	// The scan itself: it must have found the pages the help is known to
	// name, or a broken pattern would pass everything.
	for _, want := range []string{"docs/config.md", "docs/rules.md", "docs/webhook.md", "plugins/image-refresh-render"} {
		if !checked[want] {
			t.Errorf("the scan did not find %s among the help texts' paths %v; the pattern is broken", want, checked)
		}
	}
}

// TestHelp_StatusListsEveryState: `status --help` lists every state of the
// engine's state table, and the root help every workload kind of the kind
// table.
func TestHelp_StatusListsEveryState(t *testing.T) {
	root := NewRoot(io.Discard, io.Discard)
	status, _, err := root.Find([]string{"status"})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Join(strings.Fields(status.Long), " ")
	for _, s := range refresh.States() {
		if !regexp.MustCompile(`(^|[ ,])` + regexp.QuoteMeta(string(s)) + `([ ,.]|$)`).MatchString(long) {
			t.Errorf("status --help does not list the state %q:\n%s", s, status.Long)
		}
	}
	rootLong := strings.Join(strings.Fields(root.Long), " ")
	for _, k := range workload.KindNames() {
		if !strings.Contains(rootLong, k) {
			t.Errorf("the root help does not name the kind %s:\n%s", k, root.Long)
		}
	}
}
