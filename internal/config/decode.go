package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decode reads the file's root mapping into c with the YAML library's
// strict decoding: an unknown key is an error, and every type error of the
// file is collected. The library names a problem by its line alone; the
// parsed node tree, walked beside the Go types, puts the field path on it.
// The walk also refuses what the library would accept: duplicate keys,
// aliases, merge keys, and a fraction where an integer belongs.
//
// A field's name is its yaml tag, and nothing else: adding a field to the
// config is adding it to its struct.
func decode(data []byte, root *yaml.Node, c *Config) *decoder {
	d := &decoder{lines: map[string]int{}, failed: map[string]bool{}, byLine: map[int][]*node{}, bad: map[*yaml.Node]bool{}}
	d.walk("", root, reflect.TypeOf(c).Elem())
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(c)
	var te *yaml.TypeError
	switch {
	case errors.As(err, &te):
		for _, msg := range te.Errors {
			d.libraryProblem(msg)
		}
	case err != nil && len(d.errs) == 0:
		// The walk reports what makes the library give up (a merge of a
		// scalar); anything else is named as the library says it.
		d.add("", 0, fmt.Sprintf("invalid config: %v", err))
	}
	d.fill(root, reflect.ValueOf(c).Elem())
	d.volumes(c)
	// Decoding problems in file order.
	slices.SortStableFunc(d.errs, func(a, b error) int {
		return a.(*FieldError).Line - b.(*FieldError).Line
	})
	return d
}

type decoder struct {
	problems
	// lines maps a field path to the line it was written on, for the
	// messages of later validation.
	lines map[string]int
	// failed holds the paths already reported, so that validation does not
	// report the same mistake again as a missing value.
	failed map[string]bool
	// byLine holds the nodes of each line in file order, for putting a path
	// on the library's "line N: …" messages.
	byLine map[int][]*node
	// bad holds the values the library refused (and so left out).
	bad map[*yaml.Node]bool
}

// node is one node of the tree: a value, or a mapping's key.
type node struct {
	*yaml.Node
	// path is the field's path; for a key, the path of its mapping.
	path string
	// typ is what the node decodes into: the field's type, or for a key
	// the mapping's struct; nil when the field is not known.
	typ reflect.Type
	key bool
	// reported: the walk reported the node's problem, so a library message
	// about it is dropped; mapped: a library message was put on it.
	reported, mapped bool
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

var durationType = reflect.TypeFor[time.Duration]()

// walk records the line of every field and the node of every value and
// key under path, whose Go type is typ.
func (d *decoder) walk(path string, n *yaml.Node, typ reflect.Type) {
	if n.Kind == yaml.AliasNode {
		// Aliases let one value stand for a tree, which is a known way to
		// blow up a parser, and hide where a value was written.
		d.fail(path, n, "YAML aliases (*%s) are not supported", n.Value)
		return
	}
	for typ != nil && typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	v := &node{Node: n, path: path, typ: typ}
	d.byLine[n.Line] = append(d.byLine[n.Line], v)
	switch n.Kind {
	case yaml.MappingNode:
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			kn := &node{Node: k, path: path, typ: typ, key: true}
			d.byLine[k.Line] = append(d.byLine[k.Line], kn)
			if k.Kind != yaml.ScalarNode || isNull(k) {
				// The library refuses a list or mapping as a key, and
				// skips a null one without a word.
				kn.typ, kn.reported = reflect.TypeFor[string](), true
				d.fail(path, k, "expected a key, got %s", describe(k))
				continue
			}
			p := join(path, k.Value)
			if first, dup := seen[k.Value]; dup {
				d.fail(p, k, "duplicate key (first at line %d)", first)
				// The library leaves the whole mapping out: silence the
				// checks inside it.
				d.failed[path] = true
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
			if f, ok := yamlFields(typ)[k.Value]; ok {
				d.lines[p] = k.Line
				d.walk(p, val, f.Type)
			}
		}
	case yaml.SequenceNode:
		var elem reflect.Type
		if typ != nil && typ.Kind() == reflect.Slice {
			elem = typ.Elem()
		}
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			d.lines[p] = item.Line
			d.walk(p, item, elem)
		}
	case yaml.ScalarNode:
		if typ != nil && typ.Kind() == reflect.Int && typ != durationType && n.ShortTag() == "!!float" {
			// The library would cut 2.5 to 2.
			v.reported = true
			d.fail(path, n, "invalid integer %q", n.Value)
		}
	}
}

// yamlFields maps the yaml keys of struct type t to their fields.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	if t == nil || t.Kind() != reflect.Struct {
		return out
	}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

// The library's messages (go.yaml.in/yaml/v3's TypeError.Errors).
var (
	unknownField = regexp.MustCompile("^line ([0-9]+): field (.*) not found in type (.*)$")
	badValue     = regexp.MustCompile("^line ([0-9]+): cannot unmarshal (!!?[a-z]+)(?: `(.*)`)? into (.*)$")
	// The walk reports duplicates with the first one's line.
	duplicate = regexp.MustCompile("^line [0-9]+: (field .* already set in type|mapping key .* already defined at line)")
)

// libraryProblem reports one of the library's messages at the path of the
// node it is about, or as it is when no node matches.
func (d *decoder) libraryProblem(msg string) {
	if duplicate.MatchString(msg) {
		return
	}
	if m := unknownField.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		n, drop := d.find(line, func(n *node) bool { return n.key && n.Value == m[2] })
		if n != nil {
			d.add(n.path, line, fmt.Sprintf("unknown key %q (known keys: %s)", n.Value, knownKeys(n.typ)))
		}
		if n != nil || drop {
			return
		}
	}
	if m := badValue.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		tag, value, into := m[2], m[3], m[4]
		n, drop := d.find(line, func(n *node) bool {
			return n.typ != nil && n.typ.String() == into && n.ShortTag() == tag && abbreviates(value, n.Value)
		})
		if n != nil {
			d.badValue(n)
		}
		if n != nil || drop {
			return
		}
	}
	line, rest := 0, msg
	if l, r, ok := strings.Cut(strings.TrimPrefix(msg, "line "), ": "); ok {
		if i, err := strconv.Atoi(l); err == nil {
			line, rest = i, r
		}
	}
	d.add("", line, rest)
}

// find returns the first node of line that fits and has no message yet,
// marked mapped. drop: the walk reported that node's problem, or every node
// that fits has its message (the library repeats one through an alias).
func (d *decoder) find(line int, fits func(*node) bool) (n *node, drop bool) {
	for _, n := range d.byLine[line] {
		switch {
		case !fits(n):
		case n.mapped:
			drop = true
		case n.reported:
			return nil, true
		default:
			n.mapped = true
			return n, false
		}
	}
	return nil, drop
}

// abbreviates reports whether the library's quote of a value, which it
// cuts to 7 characters and "..." past 10, is of value.
func abbreviates(quote, value string) bool {
	if short, ok := strings.CutSuffix(quote, "..."); ok && len(value) > 10 {
		return strings.HasPrefix(value, short)
	}
	return quote == value || quote == ""
}

// badValue reports a value of the wrong type, saying what belongs there.
func (d *decoder) badValue(n *node) {
	d.bad[n.Node] = true
	scalar := n.Kind == yaml.ScalarNode
	switch {
	case n.typ == durationType && scalar:
		d.fail(n.path, n.Node, "invalid duration %q (write it like \"90s\" or \"10m\")", n.Value)
	case n.typ.Kind() == reflect.Int && scalar:
		d.fail(n.path, n.Node, "invalid integer %q", n.Value)
	case n.typ.Kind() == reflect.Bool && scalar:
		d.fail(n.path, n.Node, "invalid boolean %q (want true or false)", n.Value)
	default:
		d.fail(n.path, n.Node, "expected %s, got %s", want(n.typ), describe(n.Node))
	}
}

func want(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration"
	case t.Kind() == reflect.Struct:
		return "a mapping"
	case t.Kind() == reflect.Slice:
		return "a list"
	case t.Kind() == reflect.Int:
		return "an integer"
	case t.Kind() == reflect.Bool:
		return "true or false"
	}
	return "a string"
}

// volumes moves each target's `volume: NAME` into its Container (K1).
func (d *decoder) volumes(c *Config) {
	for i := range c.Groups {
		for j := range c.Groups[i].Images {
			for k := range c.Groups[i].Images[j].Targets {
				t := &c.Groups[i].Images[j].Targets[k]
				switch {
				case t.VolumeName == "":
				case t.Container != "":
					p := fmt.Sprintf("groups[%d].images[%d].targets[%d]", i, j, k)
					d.failed[p] = true
					d.add(p, d.lines[p], "container and volume are exclusive: a target is one container (or init container) or one image volume")
				default:
					t.Container = VolumeKey(t.VolumeName)
				}
				t.VolumeName = ""
			}
		}
	}
}

// fill makes the decoded value v of node n what the file says where the
// library differs: it drops a list item that is null or of the wrong type,
// which would shift the indexes of later messages, so the item is put back
// as its zero value (null is an empty mapping, the old decoder's reading);
// a null mapping is an empty one, not none; and an empty list is none.
func (d *decoder) fill(n *yaml.Node, v reflect.Value) {
	if n.Kind == yaml.AliasNode {
		return
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() && isNull(n) && v.Type().Elem().Kind() == reflect.Struct {
			v.Set(reflect.New(v.Type().Elem()))
		}
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch {
	case n.Kind == yaml.MappingNode && v.Kind() == reflect.Struct:
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if seen[k.Value] || k.Kind != yaml.ScalarNode {
				continue
			}
			seen[k.Value] = true
			if f, ok := yamlFields(v.Type())[k.Value]; ok {
				d.fill(n.Content[i+1], v.FieldByIndex(f.Index))
			}
		}
	case n.Kind == yaml.SequenceNode && v.Kind() == reflect.Slice:
		if v.IsNil() {
			return // the library left the list out (its mapping has a duplicate key)
		}
		if len(n.Content) == 0 {
			v.SetZero()
			return
		}
		out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		nillable := slices.Contains([]reflect.Kind{reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface}, v.Type().Elem().Kind())
		j := 0
		for i, item := range n.Content {
			if item.Kind == yaml.AliasNode {
				item = item.Alias
			}
			if d.bad[item] || (isNull(item) && !nillable) || j >= v.Len() {
				continue // the library dropped it
			}
			out.Index(i).Set(v.Index(j))
			j++
		}
		v.Set(out)
		for i, item := range n.Content {
			d.fill(item, out.Index(i))
		}
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

func knownKeys(t reflect.Type) string {
	keys := make([]string, 0)
	for k := range yamlFields(t) {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}
