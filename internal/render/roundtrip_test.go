package render

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
)

// fixture reads testdata/roundtrip.yaml: a Helm-like stream with comments,
// anchors and aliases, a leading "---", a "..." end marker, an empty
// document, a CRD, a List, documents that manage nothing and a last
// document without a final newline. crlf converts it to Windows line
// endings.
func fixture(t testing.TB, crlf bool) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/roundtrip.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.HasSuffix(b, []byte("\n")) {
		t.Fatal("the fixture must end without a newline")
	}
	if crlf {
		b = bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
	}
	return b
}

func TestRoundTrip_B2_WithoutRecordsEveryByteIsKept(t *testing.T) {
	for _, crlf := range []bool{false, true} {
		in := fixture(t, crlf)
		s, err := Parse(in, loadConfig(t, ""), "tb")
		if err != nil {
			t.Fatal(err)
		}
		res := s.Pin(map[ImageKey]string{}, nil)
		if !bytes.Equal(res.Out, in) {
			t.Errorf("crlf=%v: output differs from the input:\n%s", crlf, lineDiff(in, res.Out))
		}
		// One note per image without a record: api (four containers) and hub.
		if len(res.Notes) != 2 || !strings.Contains(res.Notes[0].String(), "image api (group web)") ||
			!strings.Contains(res.Notes[1].String(), "image hub (group web)") {
			t.Errorf("crlf=%v: notes %q, want one for api and one for hub", crlf, res.Notes)
		}
	}
}

func TestRoundTrip_B2_WithRecordsOnlyTheImageScalarsChange(t *testing.T) {
	const api = "registry.example.com/acme/api:prod"
	replacements := [][2]string{
		{"image: " + api + "   # pinned", "image: " + api + "@" + d1 + "   # pinned"},
		{`image: "docker.io/acme/hub:v1"`, `image: "docker.io/acme/hub:v1@` + d1 + `"`},
		{"{name: agent, image: '" + api + "'}", "{name: agent, image: '" + api + "@" + d1 + "'}"},
		{`image:   "` + api + "@" + d2 + `"`, `image:   "` + api + "@" + d1 + `"`},
	}
	for _, crlf := range []bool{false, true} {
		in := fixture(t, crlf)
		want := string(in)
		for _, r := range replacements {
			if n := strings.Count(want, r[0]); n != 1 {
				t.Fatalf("fixture holds %q %d times, want once", r[0], n)
			}
			want = strings.Replace(want, r[0], r[1], 1)
		}
		s, err := Parse(in, loadConfig(t, ""), "tb")
		if err != nil {
			t.Fatal(err)
		}
		res := s.Pin(web, nil)
		if string(res.Out) != want {
			t.Errorf("crlf=%v: output differs from the expected one:\n%s", crlf, lineDiff([]byte(want), res.Out))
		}
		// The same, said as a byte diff against the input: only the four
		// image lines differ.
		changed := changedLines(in, res.Out)
		if len(changed) != len(replacements) {
			t.Errorf("crlf=%v: %d lines changed, want %d:\n%s", crlf, len(changed), len(replacements), lineDiff(in, res.Out))
		}
		for _, l := range changed {
			if !strings.Contains(l, "image:") {
				t.Errorf("crlf=%v: a line other than an image changed: %q", crlf, l)
			}
		}
		if len(res.Changes) != len(replacements) || len(res.Notes) != 0 {
			t.Errorf("crlf=%v: changes %+v notes %q, want %d changes and no note", crlf, res.Changes, res.Notes, len(replacements))
		}
	}
}

// changedLines returns the lines of a that differ in b; a and b must have
// the same number of lines (a pin never adds or removes one).
func changedLines(a, b []byte) []string {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	if len(la) != len(lb) {
		return []string{"line count changed"}
	}
	var out []string
	for i := range la {
		if !bytes.Equal(la[i], lb[i]) {
			out = append(out, string(la[i]))
		}
	}
	return out
}

// lineDiff shows the differing lines of two streams, for failure messages.
func lineDiff(want, got []byte) string {
	lw, lg := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var b strings.Builder
	for i := 0; i < max(len(lw), len(lg)); i++ {
		var w, g []byte
		if i < len(lw) {
			w = lw[i]
		}
		if i < len(lg) {
			g = lg[i]
		}
		if !bytes.Equal(w, g) {
			b.WriteString(fmt.Sprintf("line %d:\n  want %q\n   got %q\n", i+1, w, g))
		}
	}
	return b.String()
}
