package refresh

import (
	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

// Skip says why fix B leaves a rendered image as written.
type Skip string

const (
	SkipNone            Skip = ""
	SkipOperatorPin     Skip = "operator-pin"     // R2: the chart owns that digest
	SkipUnparsable      Skip = "unparsable"       // not an image reference
	SkipOnDigest        Skip = "on-digest"        // R7: compares the digest only
	SkipOtherRepository Skip = "other-repository" // R3: no proof another registry holds it
	SkipOtherTag        Skip = "other-tag"        // another tag, or no tag at all
	SkipNoRecord        Skip = "no-record"        // R5: fresh install, nothing recorded
	SkipInvalidRecord   Skip = "invalid-record"   // the anchor's record is not a digest
)

// PinRendered is fix B's one decision (SPEC B1, B2): the reference that a
// rendered or admitted container image live of img is rewritten to — the
// pin of the group's recorded digest, keeping the repository as written —
// or why it is left alone. The webhook and the post-renderer both call it,
// so the rule lives here once; fix A (R7) heals whatever it leaves.
func PinRendered(img config.Image, live, recorded string, hasRecord bool, format imageref.PinFormat) (string, Skip) {
	if img.PinnedDigest != "" {
		return "", SkipOperatorPin
	}
	ref, err := imageref.Parse(live)
	if err != nil {
		return "", SkipUnparsable
	}
	if hasRecord && ref.Digest == recorded {
		return "", SkipOnDigest
	}
	if _, mirror := NeedsMirrorProof(img, live); mirror {
		return "", SkipOtherRepository
	}
	if ref.Tag != img.Tag {
		return "", SkipOtherTag
	}
	if !hasRecord {
		return "", SkipNoRecord
	}
	if _, err := imageref.ParseDigest(recorded); err != nil {
		return "", SkipInvalidRecord
	}
	return imageref.Pin(ref.Repository, ref.Tag, recorded, format), SkipNone
}
