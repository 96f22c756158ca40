package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decoder walks the YAML node tree by hand instead of yaml's struct decoding,
// so that it can report every unknown key, duplicate key and bad value with
// its field path and line, and keep going.
type decoder struct {
	problems
	// lines maps a field path to the line it was written on, for the
	// messages of later validation.
	lines map[string]int
	// failed holds the paths already reported, so that validation does not
	// report the same mistake again as a missing value.
	failed map[string]bool
}

// fieldFunc decodes the value node n of the field at path.
type fieldFunc func(path string, n *yaml.Node)

func newDecoder() *decoder {
	return &decoder{lines: map[string]int{}, failed: map[string]bool{}}
}

func (d *decoder) fail(path string, n *yaml.Node, format string, args ...any) {
	d.failed[path] = true
	d.add(path, n.Line, fmt.Sprintf(format, args...))
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// usable reports whether n can be decoded. Aliases are refused: they would
// need merge-key semantics the hand walk does not implement, and expanding
// them is a known way to blow up a parser.
func (d *decoder) usable(path string, n *yaml.Node) bool {
	if n.Kind == yaml.AliasNode {
		d.fail(path, n, "YAML aliases (*%s) are not supported", n.Value)
		return false
	}
	return true
}

// mapping decodes a mapping node through the known fields; a null value is
// an empty mapping.
func (d *decoder) mapping(path string, n *yaml.Node, fields map[string]fieldFunc) {
	if !d.usable(path, n) || isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "expected a mapping, got %s", describe(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(path, k, "expected a key, got %s", describe(k))
			continue
		}
		p := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.fail(p, k, "duplicate key (first at line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		if k.ShortTag() == "!!merge" {
			// The mapping lacks what the merge would have brought:
			// silence the checks inside it too.
			d.fail(p, k, "YAML merge keys (<<) are not supported")
			d.failed[path] = true
			continue
		}
		set, known := fields[k.Value]
		if !known {
			d.add(path, k.Line, fmt.Sprintf("unknown key %q (known keys: %s)", k.Value, knownKeys(fields)))
			continue
		}
		d.lines[p] = k.Line
		if d.usable(p, v) {
			set(p, v)
		}
	}
}

// sequence decodes each item of a sequence node with item (which decodes a
// mapping, so aliases are refused there); a null value is an empty list.
func (d *decoder) sequence(path string, n *yaml.Node, item fieldFunc) {
	if !d.usable(path, n) || isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(path, n, "expected a list, got %s", describe(n))
		return
	}
	for i, v := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		d.lines[p] = v.Line
		// Always decode (and so append), even a bad item, so that list
		// indexes in later messages match the file.
		item(p, v)
	}
}

// scalar returns the text of a scalar node; false for null (the field keeps
// its default) and for a mapping or list (reported).
func (d *decoder) scalar(path string, n *yaml.Node, want string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.fail(path, n, "expected %s, got %s", want, describe(n))
		return "", false
	}
	return n.Value, !isNull(n)
}

func (d *decoder) str(dst *string) fieldFunc {
	return func(path string, n *yaml.Node) {
		if s, ok := d.scalar(path, n, "a string"); ok {
			*dst = s
		}
	}
}

func (d *decoder) integer(dst *int) fieldFunc {
	return func(path string, n *yaml.Node) {
		s, ok := d.scalar(path, n, "an integer")
		if !ok {
			return
		}
		var v int
		if n.ShortTag() != "!!int" || n.Decode(&v) != nil {
			d.fail(path, n, "invalid integer %q", s)
			return
		}
		*dst = v
	}
}

func (d *decoder) boolean(dst *bool) fieldFunc {
	return func(path string, n *yaml.Node) {
		s, ok := d.scalar(path, n, "true or false")
		if !ok {
			return
		}
		var v bool
		if n.Decode(&v) != nil {
			d.fail(path, n, "invalid boolean %q (want true or false)", s)
			return
		}
		*dst = v
	}
}

func (d *decoder) duration(dst *time.Duration) fieldFunc {
	return func(path string, n *yaml.Node) {
		s, ok := d.scalar(path, n, "a duration")
		if !ok {
			return
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			d.fail(path, n, "invalid duration %q (write it like \"90s\" or \"10m\")", s)
			return
		}
		*dst = v
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	default:
		return fmt.Sprintf("%q", n.Value)
	}
}

func knownKeys(fields map[string]fieldFunc) string {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}
