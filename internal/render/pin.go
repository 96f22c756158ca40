package render

import (
	"fmt"
	"strings"

	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/refresh"
)

// Note says why an image of the stream was left as rendered: one line on
// stderr.
type Note struct {
	// Group and Image name the configured image; both "" when the note is
	// about no configured image.
	Group, Image string
	// Where lists the containers, e.g. "document 2: Deployment tb/api
	// container api".
	Where  string
	Reason string
	// Warning marks a note that most likely points at a misconfiguration
	// (a namespace not passed, another repository or tag than configured,
	// a corrupt record) rather than at a benign state such as a fresh
	// install.
	Warning bool
}

func (n Note) String() string {
	if n.Image == "" {
		return fmt.Sprintf("%s: %s", n.Where, n.Reason)
	}
	return fmt.Sprintf("image %s (group %s) in %s: %s", n.Image, n.Group, n.Where, n.Reason)
}

// Change is one image scalar Pin rewrote.
type Change struct {
	Group, Image string
	Where        string
	From, To     string
}

// Result is a pinned stream.
type Result struct {
	// Out is the stream with the changes made; when there are none it is
	// the input itself.
	Out     []byte
	Changes []Change
	Notes   []Note
}

// Pin returns the stream with every managed container whose image is the
// configured repo:tag (or repo:tag@another-digest) pinned to the image's
// recorded digest, in the config's pin format (SPEC B2). recorded maps each
// image to its recorded digest; unread gives, per group, why its anchor
// could not be read, for the notes. Left as rendered, each with a note:
// images with no record (one note per image), on another registry (R3:
// render has no proof that it holds the digest; fix A has), on another tag,
// and images whose text is shared through YAML aliases. An image already on
// the recorded digest is left as is (R7 compares only the digest), and so is
// an operator-pinned one (R2), silently.
func (s *Stream) Pin(recorded map[ImageKey]string, unread map[string]string) Result {
	res := Result{Notes: append([]Note(nil), s.notes...)}
	var edits []edit
	var starts []int
	missing := map[ImageKey][]string{}
	var missingOrder []ImageKey
	note := func(st site, warning bool, format string, args ...any) {
		res.Notes = append(res.Notes, Note{Group: st.group, Image: st.image.Name, Where: st.where(), Reason: fmt.Sprintf(format, args...), Warning: warning})
	}
	for _, st := range s.sites {
		key := ImageKey{Group: st.group, Image: st.image.Name}
		if st.image.PinnedDigest != "" {
			continue // the operator's pin (R2); fix A reports a stale one
		}
		if why, ok := s.suspended[st.group]; ok {
			note(st, false, "left as rendered: group %s is %s (docs/states/suspended.md)", st.group, why)
			continue
		}
		value := st.node.Value
		digest, ok := recorded[key]
		to, skip := refresh.PinRendered(st.image, value, digest, ok, st.pinFormat)
		switch skip {
		case refresh.SkipOperatorPin, refresh.SkipOnDigest:
			continue // the operator's pin (R2; fix A reports a stale one), or already on it (R7)
		case refresh.SkipUnparsable:
			_, err := imageref.Parse(value)
			note(st, true, "left as rendered: %v", err)
			continue
		case refresh.SkipOtherRepository:
			repo, _ := refresh.NeedsMirrorProof(st.image, value)
			if sameRegistry(repo, st.image.Repository) {
				note(st, true, "left as rendered: repository %s is not the configured %s", repo, st.image.Repository)
			} else {
				note(st, false, "left as rendered: %s is served by another registry than %s, and render cannot prove it holds the recorded digest (docs/mirrors.md); image-refresh pins it on the cluster once it can", repo, st.image.Repository)
			}
			continue
		case refresh.SkipOtherTag:
			ref, _ := imageref.Parse(value)
			note(st, true, "left as rendered: tag %q is not the configured tag %q", ref.Tag, st.image.Tag)
			continue
		case refresh.SkipNoRecord:
			if _, seen := missing[key]; !seen {
				missingOrder = append(missingOrder, key)
			}
			missing[key] = append(missing[key], st.where())
			continue
		case refresh.SkipInvalidRecord:
			_, err := imageref.ParseDigest(digest)
			note(st, true, "left on the tag: the recorded digest on the anchor is not a digest: %v", err)
			continue
		}
		if st.shared != "" {
			note(st, false, "left as rendered: %s; image-refresh pins it on the cluster", st.shared)
			continue
		}
		if starts == nil {
			starts = lineStarts(s.src)
		}
		off, end, err := textSpan(s.src, starts, st.node)
		if err != nil {
			note(st, false, "left as rendered: cannot locate the image text: %v; image-refresh pins it on the cluster", err)
			continue
		}
		edits = append(edits, edit{off: off, end: end, text: to})
		res.Changes = append(res.Changes, Change{Group: st.group, Image: st.image.Name, Where: st.where(), From: value, To: to})
	}
	for _, key := range missingOrder {
		why := "the group's anchor holds no recorded digest yet (a fresh install, or image-refresh has not observed the image)"
		if reason, ok := unread[key.Group]; ok {
			why = "the group's anchor could not be read: " + reason
		}
		res.Notes = append(res.Notes, Note{Group: key.Group, Image: key.Image, Where: strings.Join(missing[key], "; "),
			Reason: "left on the tag: " + why + "; image-refresh pins it on the cluster once it is stored (docs/post-renderer.md)"})
	}
	res.Out = apply(s.src, edits)
	return res
}

func sameRegistry(a, b string) bool {
	ra, err1 := imageref.Registry(a)
	rb, err2 := imageref.Registry(b)
	return err1 == nil && err2 == nil && ra == rb
}
