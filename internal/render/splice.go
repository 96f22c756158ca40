package render

import (
	"bytes"
	"fmt"
	"sort"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// edit replaces src[off:end] with text.
type edit struct {
	off, end int
	text     string
}

// bom is the UTF-8 byte order mark; the YAML reader skips it before line 1.
var bom = []byte("\xef\xbb\xbf")

// lineStarts returns the byte offset at which each line starts, counting
// lines as the YAML scanner does: CR LF, CR, LF, NEL, LS and PS each end
// one.
func lineStarts(src []byte) []int {
	start := 0
	if bytes.HasPrefix(src, bom) {
		start = len(bom)
	}
	starts := []int{start}
	for i := start; i < len(src); i++ {
		switch {
		case src[i] == '\r' && i+1 < len(src) && src[i+1] == '\n':
			i++
			starts = append(starts, i+1)
		case src[i] == '\r' || src[i] == '\n':
			starts = append(starts, i+1)
		case src[i] == 0xC2 && i+1 < len(src) && src[i+1] == 0x85:
			i++
			starts = append(starts, i+1)
		case src[i] == 0xE2 && i+2 < len(src) && src[i+1] == 0x80 && (src[i+2] == 0xA8 || src[i+2] == 0xA9):
			i += 2
			starts = append(starts, i+1)
		}
	}
	return starts
}

// offset converts a node's 1-based line and column (in characters) to a
// byte offset in src.
func offset(src []byte, starts []int, line, column int) (int, bool) {
	if line < 1 || line > len(starts) || column < 1 {
		return 0, false
	}
	off := starts[line-1]
	for range column - 1 {
		if off >= len(src) {
			return 0, false
		}
		_, w := utf8.DecodeRune(src[off:])
		off += w
	}
	return off, true
}

// textSpan locates the text of scalar n in src: the whole scalar when it is
// plain, the part between the quotes when it is quoted. It checks that the
// bytes found are exactly n's value, so a position the scanner counted
// differently (an encoding other than UTF-8, say) is refused, never
// mis-spliced.
func textSpan(src []byte, starts []int, n *yaml.Node) (off, end int, err error) {
	off, ok := offset(src, starts, n.Line, n.Column)
	if !ok {
		return 0, 0, fmt.Errorf("line %d column %d is outside the stream", n.Line, n.Column)
	}
	quote := byte(0)
	switch n.Style {
	case 0:
	case yaml.DoubleQuotedStyle:
		quote = '"'
	case yaml.SingleQuotedStyle:
		quote = '\''
	default:
		return 0, 0, fmt.Errorf("unsupported scalar style")
	}
	if quote != 0 {
		if off >= len(src) || src[off] != quote {
			return 0, 0, fmt.Errorf("no %c at line %d column %d", quote, n.Line, n.Column)
		}
		off++
	}
	end = off + len(n.Value)
	if end > len(src) || string(src[off:end]) != n.Value {
		return 0, 0, fmt.Errorf("the text at line %d column %d is not the parsed value (escapes, or a line break inside the scalar)", n.Line, n.Column)
	}
	if quote != 0 && (end >= len(src) || src[end] != quote) {
		return 0, 0, fmt.Errorf("the quoted text at line %d column %d uses escapes", n.Line, n.Column)
	}
	if quote == 0 && end < len(src) && bytes.IndexByte(plainEnd, src[end]) < 0 {
		return 0, 0, fmt.Errorf("the plain scalar at line %d column %d continues past its value", n.Line, n.Column)
	}
	return off, end, nil
}

// plainEnd holds the bytes that can follow a plain scalar's last
// character: a blank, a line break (0xC2 and 0xE2 start NEL, LS and PS) or
// a flow indicator.
var plainEnd = []byte(" \t\r\n,]}\xc2\xe2")

// apply returns src with the edits made; they must not overlap.
func apply(src []byte, edits []edit) []byte {
	if len(edits) == 0 {
		return src
	}
	sort.Slice(edits, func(i, j int) bool { return edits[i].off < edits[j].off })
	var out bytes.Buffer
	out.Grow(len(src) + 128*len(edits))
	last := 0
	for _, e := range edits {
		out.Write(src[last:e.off])
		out.WriteString(e.text)
		last = e.end
	}
	out.Write(src[last:])
	return out.Bytes()
}
