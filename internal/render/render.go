// Package render pins the managed images of a rendered manifest stream to
// their recorded digests: the core of `image-refresh render`, the Helm
// post-renderer of fix B (SPEC B2). It is pure: the caller reads the
// recorded digests from the anchors and passes them in.
//
// Only the text of the image scalars it pins changes. Every other byte of
// the stream — comments, quoting, indentation, anchors, line endings,
// document separators — is kept, because the scalars are located by their
// YAML positions and spliced into the original bytes; documents are never
// re-marshalled.
package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

// ImageKey names one configured image: image names are unique in a group,
// not across groups.
type ImageKey struct{ Group, Image string }

// Stream is a parsed manifest stream and the managed containers found in it.
type Stream struct {
	src       []byte
	groups    []string // every group, in config order
	documents int
	sites     []site
	notes     []Note // found while parsing, reported by Pin
	targets   map[config.Target]managed
	suspended map[string]string // group → its suspension, said in the notes (O1)
}

// Suspend leaves the images of group as rendered (O1): Pin notes why
// instead of pinning them.
func (s *Stream) Suspend(group, why string) {
	if s.suspended == nil {
		s.suspended = map[string]string{}
	}
	s.suspended[group] = why
}

// managed is the configured image a target runs.
type managed struct {
	group string
	image config.Image
	// pinFormat is the group's: a discovered group's pins keep the tag (D1).
	pinFormat imageref.PinFormat
}

// SyntaxError is a stream that is not YAML. Document is 1-based; Line is
// the line of the whole stream that the YAML parser names (for some errors
// the line where the enclosing collection starts, or the one before it).
type SyntaxError struct {
	Document int
	Line     int
	Err      error
}

func (e *SyntaxError) Error() string {
	msg := errPrefix.ReplaceAllString(e.Err.Error(), "")
	return fmt.Sprintf("document %d, line %d: %s", e.Document, e.Line, msg)
}

func (e *SyntaxError) Unwrap() error { return e.Err }

var (
	errLine   = regexp.MustCompile(`^yaml: line (\d+):`)
	errPrefix = regexp.MustCompile(`^yaml: (line \d+: )?`)
)

// Parse reads every document of stream and finds the containers of
// cfg's targets in it. namespace is the namespace of documents that have no
// metadata.namespace (Helm installs them into the release namespace). A
// stream that is not YAML is a *SyntaxError.
func Parse(stream []byte, cfg *config.Config, namespace string) (s *Stream, err error) {
	s = &Stream{src: stream, targets: map[config.Target]managed{}}
	for _, g := range cfg.Groups {
		s.groups = append(s.groups, g.Name)
		for _, img := range g.Images {
			for _, t := range img.Targets {
				s.targets[t] = managed{group: g.Name, image: img, pinFormat: g.PinFormat(cfg.PinFormat)}
			}
		}
	}
	doc := 0
	// The decoder has panicked on hostile input before; a post-renderer must
	// fail with a message, not a stack trace.
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, &SyntaxError{Document: doc, Err: fmt.Errorf("YAML decoder failed: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(stream))
	for {
		doc++
		var root yaml.Node
		if err := dec.Decode(&root); err != nil {
			if errors.Is(err, io.EOF) {
				s.documents = doc - 1
				return s, nil
			}
			// The parser leaves the line out when it is the first.
			line := 1
			if m := errLine.FindStringSubmatch(err.Error()); m != nil {
				line, _ = strconv.Atoi(m[1])
			}
			return nil, &SyntaxError{Document: doc, Line: line, Err: err}
		}
		w := walker{s: s, doc: doc, namespace: namespace}
		if len(root.Content) == 1 {
			w.object(root.Content[0], 0)
		}
	}
}

// Groups returns the names of the groups that have a target in the
// stream, in config order: the anchors whose records Pin needs.
func (s *Stream) Groups() []string {
	seen := map[string]bool{}
	for _, st := range s.sites {
		if st.image.PinnedDigest == "" {
			seen[st.group] = true
		}
	}
	var out []string
	for _, g := range s.groups {
		if seen[g] {
			out = append(out, g)
		}
	}
	return out
}
