package config

import (
	"errors"
	"fmt"
	"strings"
)

// FieldError is one problem in a config, at a field path such as
// "groups[0].images[1].targets[2].container".
type FieldError struct {
	// Path is empty for a problem with the file as a whole.
	Path string
	// Line is 0 when not known (a Config built in code, a missing field
	// whose parent has no line either).
	Line int
	Msg  string
}

func (e *FieldError) Error() string {
	s := e.Msg
	if e.Path != "" {
		s = e.Path + ": " + s
	}
	if e.Line > 0 {
		s += fmt.Sprintf(" (line %d)", e.Line)
	}
	return s
}

// problems collects FieldErrors, so that one run reports every mistake.
type problems struct {
	errs []error
}

func (p *problems) add(path string, line int, msg string) {
	p.errs = append(p.errs, &FieldError{Path: path, Line: line, Msg: msg})
}

// wrap names the source in front of the joined problems: on the same line for
// one problem, one per line below it for several.
func wrap(source string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	if source == "" {
		source = "config"
	}
	if len(errs) == 1 {
		return fmt.Errorf("%s: %w", source, errs[0])
	}
	return fmt.Errorf("%s: %d problems:\n%w", source, len(errs), errors.Join(errs...))
}

// lineOf returns the line of path, or of its nearest parent that has one:
// a missing field is reported at the item that lacks it.
func lineOf(lines map[string]int, path string) int {
	for p := path; p != ""; p = parent(p) {
		if l, ok := lines[p]; ok {
			return l
		}
	}
	return 0
}

// parent strips the last element of a field path: "a.b[2]" → "a.b" → "a" → "".
func parent(path string) string {
	if i := strings.LastIndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return ""
}
