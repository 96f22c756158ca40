package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"
)

// narrator prints the story: every line starts with the wall-clock time and
// the time since the demo started, so the figures can be read off the log.
type narrator struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
}

func newNarrator(out io.Writer) *narrator { return &narrator{out: out, start: time.Now()} }

func (n *narrator) line(indent, text string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	fmt.Fprintf(n.out, "%s %+7.1fs  %s%s\n", now.Format("15:04:05.000"), now.Sub(n.start).Seconds(), indent, text)
}

// step opens a numbered chapter of the story.
func (n *narrator) step(num, of int, title string) {
	n.line("", "")
	n.line("", fmt.Sprintf("━━ %d/%d  %s", num, of, title))
}

// say narrates; multi-line text keeps the prefix on every line.
func (n *narrator) say(format string, args ...any) {
	for _, l := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		n.line("   ", l)
	}
}

// ok states a checked fact: the demo failed before printing it otherwise.
func (n *narrator) ok(format string, args ...any) { n.line("   ✔ ", fmt.Sprintf(format, args...)) }

// command shows a command line about to run.
func (n *narrator) command(cmd string) { n.line("   $ ", cmd) }

// slogTime is the time= field of a slog text line: the narrator's own
// prefix already says when it was written.
var slogTime = regexp.MustCompile(`^time=\S+ `)

// output returns a writer that prints a command's output as it comes,
// indented under the command, one narrated line per line written.
func (n *narrator) output() *lineWriter { return &lineWriter{n: n} }

type lineWriter struct {
	n    *narrator
	buf  bytes.Buffer
	text strings.Builder // everything written, for the caller to inspect
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.text.Write(p)
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.n.line("       ", slogTime.ReplaceAllString(string(w.buf.Next(i + 1)[:i]), ""))
	}
}

// Flush prints a last line that did not end in a newline.
func (w *lineWriter) Flush() {
	if w.buf.Len() > 0 {
		w.n.line("       ", w.buf.String())
		w.buf.Reset()
	}
}

func (w *lineWriter) String() string { return w.text.String() }

// short abbreviates a digest for tables: sha256:0123456789ab….
func short(digest string) string {
	if i := strings.IndexByte(digest, ':'); i >= 0 && len(digest) > i+13 {
		return digest[:i+13] + "…"
	}
	return digest
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }
