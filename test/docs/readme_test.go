// Package readme checks that every command README.md shows works as written:
// the make targets exist, the image-refresh command lines parse with the
// real CLI, the docs/ links exist, and the local-cluster commands run for
// real against a cluster of their own.
package readme

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
)

// root is the repository root (the directory holding go.mod).
func root(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block is one fenced code block of README.md.
type block struct {
	lang  string
	line  int // line number of the opening fence
	lines []string
}

func codeBlocks(md string) []block {
	var out []block
	var cur *block
	for i, l := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "```") {
			if cur == nil {
				cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 1}
			} else {
				out = append(out, *cur)
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.lines = append(cur.lines, l)
		}
	}
	return out
}

// command is one shell command line of README.md, comments stripped.
type command struct {
	text string
	line int
}

func (c command) String() string { return fmt.Sprintf("README.md:%d: %s", c.line, c.text) }

// shellCommands returns the command lines of the shell blocks: the lines
// after a `$ ` prompt in a block that shows output, every line otherwise.
// YAML and other languages are not commands.
func shellCommands(blocks []block) []command {
	var out []command
	for _, b := range blocks {
		switch b.lang {
		case "", "sh", "bash", "shell", "console":
		default:
			continue
		}
		prompted := false
		for _, l := range b.lines {
			prompted = prompted || strings.HasPrefix(l, "$ ")
		}
		for i, l := range b.lines {
			if prompted {
				var ok bool
				if l, ok = strings.CutPrefix(l, "$ "); !ok {
					continue // output
				}
			}
			if text := strings.TrimSpace(stripComment(l)); text != "" {
				out = append(out, command{text, b.line + 1 + i})
			}
		}
	}
	return out
}

// stripComment drops a shell comment: # at the start of a word, outside
// quotes.
func stripComment(s string) string {
	var quote rune
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return s[:i]
		}
	}
	return s
}

// simpleCommands splits a command line into its simple commands: the
// bodies of $(…) substitutions become commands of their own (and a
// placeholder word in their place), and &&, ||, ;, | separate commands.
func simpleCommands(line string) [][]string {
	var out [][]string
	var b strings.Builder
	for i := 0; i < len(line); i++ {
		if strings.HasPrefix(line[i:], "$(") {
			depth, j := 1, i+2
			for ; j < len(line) && depth > 0; j++ {
				switch line[j] {
				case '(':
					depth++
				case ')':
					depth--
				}
			}
			out = append(out, simpleCommands(line[i+2:j-1])...)
			b.WriteString("$SUBST")
			i = j - 1
			continue
		}
		b.WriteByte(line[i])
	}
	var cur []string
	for _, w := range words(b.String()) {
		if w == "&&" || w == "||" || w == ";" || w == "|" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, w)
	}
	return append(out, cur)
}

// words splits like a shell: whitespace separates, quotes group and are
// removed, and the operators &&, ||, ; and | are words of their own.
func words(s string) []string {
	var out []string
	var w strings.Builder
	inWord := false
	var quote byte
	flush := func() {
		if inWord {
			out = append(out, w.String())
		}
		w.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			flush()
		case strings.HasPrefix(s[i:], "&&") || strings.HasPrefix(s[i:], "||"):
			flush()
			out = append(out, s[i:i+2])
			i++
		case c == ';' || c == '|':
			flush()
			out = append(out, string(c))
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return out
}

// makeTargets lists the Makefile's targets from make's database (make -pq
// runs no recipe).
func makeTargets(t *testing.T, dir string) map[string]bool {
	t.Helper()
	cmd := exec.Command("make", "-pRrq", "-f", "Makefile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) { // -q exits 1 when the goal is out of date
		t.Fatalf("make -pRrq: %v", err)
	}
	targets := map[string]bool{}
	rule := regexp.MustCompile(`^([A-Za-z0-9_./-]+):(?:[^=]|$)`)
	notTarget := false
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "# Not a target:" {
			notTarget = true
			continue
		}
		if m := rule.FindStringSubmatch(l); m != nil && !notTarget {
			targets[m[1]] = true
		}
		notTarget = false
	}
	if targets["no-such-target"] || targets["CACHE"] || targets["SHELL"] {
		t.Fatalf("make's database parsed into non-targets: %v", keys(targets))
	}
	for _, want := range []string{"demo", "test"} {
		if !targets[want] {
			t.Fatalf("make's database lists no %q target; the parser is broken (targets: %v)", want, keys(targets))
		}
	}
	return targets
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// makeGoals returns the targets a make command line names, skipping
// options and VAR=value assignments.
func makeGoals(args []string) []string {
	var goals []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-C" || a == "-f" || a == "-j" || a == "-o" || a == "-W" || a == "-I":
			i++
		case strings.HasPrefix(a, "-"), strings.Contains(a, "="):
		default:
			goals = append(goals, a)
		}
	}
	return goals
}

func TestReadme_MakeTargetsExist(t *testing.T) {
	dir := root(t)
	targets := makeTargets(t, dir)
	n := 0
	for _, c := range shellCommands(codeBlocks(readme(t))) {
		for _, args := range simpleCommands(c.text) {
			if len(args) == 0 || args[0] != "make" {
				continue
			}
			n++
			t.Logf("%s: make %s", c, strings.Join(args[1:], " "))
			for _, g := range makeGoals(args[1:]) {
				if !targets[g] {
					t.Errorf("%s: the Makefile has no target %q", c, g)
				}
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d make commands in README.md; expected at least `make demo` and `make test`", n)
	}
}

// inlineCode returns README.md's `code spans` outside fenced blocks.
func inlineCode(md string) []command {
	var out []command
	span := regexp.MustCompile("`([^`\n]+)`")
	fenced := false
	for i, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range span.FindAllStringSubmatch(l, -1) {
			out = append(out, command{m[1], i + 1})
		}
	}
	return out
}

// parseWithCLI checks an image-refresh command line against the real
// command tree without running it: the subcommand exists, every flag
// exists and takes the value given, and no stray argument is left.
func parseWithCLI(args []string) error {
	root := cli.NewRoot(io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if cmd == root {
		return fmt.Errorf("no subcommand in %q", strings.Join(args, " "))
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return fmt.Errorf("image-refresh %s: %w", cmd.Name(), err)
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return fmt.Errorf("image-refresh %s: %w", cmd.Name(), err)
	}
	return nil
}

func TestReadme_ImageRefreshCommandsParse(t *testing.T) {
	md := readme(t)
	var lines []command
	for _, c := range shellCommands(codeBlocks(md)) {
		for _, args := range simpleCommands(c.text) {
			if len(args) > 0 && args[0] == "image-refresh" {
				lines = append(lines, command{strings.Join(args, " "), c.line})
			}
		}
	}
	// Inline ones such as `image-refresh status --config FILE [-o json]`:
	// optional parts in brackets are parsed as if given.
	for _, c := range inlineCode(md) {
		if strings.HasPrefix(c.text, "image-refresh ") {
			lines = append(lines, command{strings.NewReplacer("[", "", "]", "").Replace(c.text), c.line})
		}
	}
	if len(lines) < 3 {
		t.Fatalf("found %d image-refresh command lines in README.md; the extraction is broken", len(lines))
	}
	for _, c := range lines {
		t.Logf("%s", c)
		if err := parseWithCLI(words(c.text)[1:]); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}

	// A flag named on its own (`--poll-interval` in the table) must exist
	// on some subcommand.
	flags := map[string]bool{}
	for _, sub := range cli.NewRoot(io.Discard, io.Discard).Commands() {
		sub.Flags().VisitAll(func(f *pflag.Flag) { flags["--"+f.Name] = true })
	}
	flagSpan := regexp.MustCompile(`^--[a-z0-9][a-z0-9-]*$`)
	for _, c := range inlineCode(md) {
		if flagSpan.MatchString(c.text) && !flags[c.text] {
			t.Errorf("%s: no image-refresh command has the flag %s", c, c.text)
		}
	}
}

// A negative control: the checker rejects what the CLI rejects.
func TestReadme_ParserRejectsWhatTheCLIRejects(t *testing.T) {
	for _, bad := range []string{
		"image-refresh tik --config x.yaml",
		"image-refresh tick --confg x.yaml",
		"image-refresh status --config",
		"image-refresh tick --config x.yaml stray",
		"image-refresh --config x.yaml",
	} {
		if err := parseWithCLI(words(bad)[1:]); err == nil {
			t.Errorf("%q parsed; the checker would miss a broken README line", bad)
		}
	}
}

func TestReadme_LinksExist(t *testing.T) {
	dir, md := root(t), readme(t)
	seen := map[string]bool{}
	check := func(target string, line int) {
		target, _, _ = strings.Cut(target, "#")
		target = strings.TrimRight(target, ".,;:")
		if target == "" || seen[target] {
			return
		}
		seen[target] = true
		if _, err := os.Stat(filepath.Join(dir, target)); err != nil {
			t.Errorf("README.md:%d: %s does not exist", line, target)
		}
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	docs := regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_./-]*)`)
	for i, l := range strings.Split(md, "\n") {
		for _, m := range link.FindAllStringSubmatch(l, -1) {
			if u := m[1]; !strings.Contains(u, "://") && !strings.HasPrefix(u, "#") && !strings.HasPrefix(u, "mailto:") {
				check(u, i+1)
			}
		}
		for _, m := range docs.FindAllStringSubmatch(l, -1) {
			check(m[1], i+1)
		}
	}
	t.Logf("checked %d relative links and docs/ paths: %v", len(seen), keys(seen))
	if len(seen) < 2 {
		t.Errorf("found only %v as links in README.md; the extraction is broken", keys(seen))
	}
}

// state is what `make cluster-up` recorded in its run directory.
type state struct {
	Procs map[string]struct {
		PID int `json:"pid"`
	} `json:"procs"`
}

// pids returns the processes the run directory records: the cluster's (by
// name) and the registry's.
func pids(t *testing.T, runDir string) map[int]string {
	t.Helper()
	out := map[int]string{}
	b, err := os.ReadFile(filepath.Join(runDir, "state.json"))
	if err != nil {
		t.Fatalf("cluster-up left no state.json: %v", err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("state.json: %v", err)
	}
	for name, p := range s.Procs {
		out[p.PID] = name
	}
	if b, err := os.ReadFile(filepath.Join(runDir, "registry.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			out[pid] = "registry"
		}
	}
	return out
}

// slow are the README commands this test does not run: each waits ~20 s
// for a node's lease to expire or come back (test/support/localcluster's tests
// cover them); their targets are checked by TestReadme_MakeTargetsExist.
var slow = regexp.MustCompile(`\bmake .*cluster-node-(down|up)\b`)

// TestReadme_LocalClusterCommandsRun runs README.md's local-cluster block
// line by line, as written, with RUN_DIR (the Makefile's `RUN_DIR ?=`)
// pointing at a directory of the test's own: cluster-up prints exactly two
// export lines, the cheap lines in between succeed, and cluster-down stops
// every process cluster-up started.
func TestReadme_LocalClusterCommandsRun(t *testing.T) {
	dir := root(t)
	var lines []command
	for _, b := range codeBlocks(readme(t)) {
		cmds := shellCommands([]block{b})
		up, down := false, false
		for _, c := range cmds {
			up = up || strings.Contains(c.text, "make -s cluster-up")
			down = down || strings.Contains(c.text, "make cluster-down") || strings.Contains(c.text, "make -s cluster-down")
		}
		if up && down {
			lines = cmds
			break
		}
	}
	if len(lines) == 0 {
		t.Fatal("README.md has no block that runs both `make -s cluster-up` and `make cluster-down`")
	}

	runDir := t.TempDir()
	env := append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=", "RUN_DIR="+runDir)
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(runDir, "state.json")); err == nil {
			cmd := exec.Command("make", "-s", "cluster-down", "RUN_DIR="+runDir)
			cmd.Dir, cmd.Env = dir, env
			_ = cmd.Run()
		}
	})
	sh := func(c command, script string) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
		cmd.Dir, cmd.Env = dir, env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		t.Logf("%s (%s)", c, time.Since(start).Round(10*time.Millisecond))
		return stdout.String(), stderr.String(), err
	}

	started := map[int]string{}
	upCall := regexp.MustCompile(`\$\((make -s cluster-up)\)`)
	exports := regexp.MustCompile(`^export (KUBECONFIG|REGISTRY)=(\S+)$`)
	downRan := false
	for _, c := range lines {
		switch {
		case slow.MatchString(c.text):
			t.Logf("%s: not run (slow)", c)
		case upCall.MatchString(c.text):
			// eval "$(make -s cluster-up)": check what eval would run.
			out, stderr, err := sh(c, upCall.FindStringSubmatch(c.text)[1]+" RUN_DIR="+runDir)
			if err != nil {
				t.Fatalf("%s: %v\n%s", c, err, stderr)
			}
			got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(got) != 2 {
				t.Fatalf("%s printed %d lines on stdout, want exactly two export lines:\n%s", c, len(got), out)
			}
			vars := map[string]string{}
			for _, l := range got {
				m := exports.FindStringSubmatch(l)
				if m == nil {
					t.Fatalf("%s printed %q, want `export KUBECONFIG=…` and `export REGISTRY=…`", c, l)
				}
				vars[m[1]] = m[2]
			}
			if len(vars) != 2 {
				t.Fatalf("%s printed %q, want KUBECONFIG and REGISTRY once each", c, got)
			}
			if _, err := os.Stat(vars["KUBECONFIG"]); err != nil {
				t.Errorf("export KUBECONFIG names a missing file: %v", err)
			}
			if resp, err := http.Get("http://" + vars["REGISTRY"] + "/v2/"); err != nil {
				t.Errorf("export REGISTRY=%s: the registry does not answer: %v", vars["REGISTRY"], err)
			} else {
				resp.Body.Close()
			}
			env = append(env, "KUBECONFIG="+vars["KUBECONFIG"], "REGISTRY="+vars["REGISTRY"])
			for pid, name := range pids(t, runDir) {
				started[pid] = name
			}
			if len(started) < 6 {
				t.Fatalf("cluster-up recorded %d processes, want etcd, the control plane, 3 kwok and the registry: %v", len(started), started)
			}
		case strings.Contains(c.text, "cluster-down"):
			if len(started) == 0 {
				t.Fatalf("%s comes before cluster-up", c)
			}
			for pid, name := range pids(t, runDir) { // kwok restarted by cluster-node-up has a new PID
				started[pid] = name
			}
			if _, stderr, err := sh(c, c.text); err != nil {
				t.Fatalf("%s: %v\n%s", c, err, stderr)
			}
			downRan = true
			// cluster-down waits for the control plane's processes;
			// the registry it only signals, so give each 10 s to exit.
			deadline := time.Now().Add(10 * time.Second)
			for pid, name := range started {
				gone, err := localcluster.WaitExit(pid, time.Until(deadline))
				if err != nil {
					t.Fatal(err)
				}
				if !gone {
					t.Errorf("after %s, %s (pid %d) still runs", c.text, name, pid)
				}
			}
			if _, err := os.Stat(filepath.Join(runDir, "state.json")); err == nil {
				t.Errorf("after %s, %s/state.json still records a cluster", c.text, runDir)
			}
		default:
			if len(started) == 0 {
				t.Fatalf("%s comes before cluster-up", c)
			}
			out, stderr, err := sh(c, c.text)
			if err != nil {
				t.Fatalf("%s: %v\n%s%s", c, err, out, stderr)
			}
			if strings.Contains(c.text, "get nodes") {
				for _, n := range []string{"node-1", "node-2", "node-3"} {
					if !strings.Contains(out, n) {
						t.Errorf("%s does not list %s:\n%s", c, n, out)
					}
				}
			}
		}
	}
	if !downRan {
		t.Fatal("the block never ran cluster-down")
	}
	t.Logf("stopped %d processes: %v", len(started), started)
}
