package refresh

import (
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

func TestPinRendered_B1_B2_OneDecisionForWebhookAndPostRenderer(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	img := config.Image{Name: "api", Repository: "docker.io/acme/api", Tag: "prod"}
	pinned := img
	pinned.PinnedDigest = d1
	for _, tc := range []struct {
		name      string
		img       config.Image
		live      string
		recorded  string
		hasRecord bool
		format    imageref.PinFormat
		want      string
		skip      Skip
	}{
		{"the bare tag is pinned to the record, repository as written", img, "acme/api:prod", d1, true, imageref.PinTagAndDigest, "acme/api:prod@" + d1, SkipNone},
		{"the digest-only format drops the tag", img, "acme/api:prod", d1, true, imageref.PinDigest, "acme/api@" + d1, SkipNone},
		{"another digest on the tag moves to the record", img, "acme/api:prod@" + d2, d1, true, imageref.PinTagAndDigest, "acme/api:prod@" + d1, SkipNone},
		{"R7: already on the record", img, "acme/api:prod@" + d1, d1, true, imageref.PinTagAndDigest, "", SkipOnDigest},
		{"R7: a mirror prefix on the record is not a revert", img, "mirror.local/acme/api@" + d1, d1, true, imageref.PinTagAndDigest, "", SkipOnDigest},
		{"R3: a mirror on the tag is left alone", img, "mirror.local/acme/api:prod", d1, true, imageref.PinTagAndDigest, "", SkipOtherRepository},
		{"R2: an operator pin is left alone", pinned, "acme/api:prod", d1, true, imageref.PinTagAndDigest, "", SkipOperatorPin},
		{"R5: no record leaves the tag", img, "acme/api:prod", "", false, imageref.PinTagAndDigest, "", SkipNoRecord},
		{"an invalid record is never pinned", img, "acme/api:prod", "sha256:nope", true, imageref.PinTagAndDigest, "", SkipInvalidRecord},
		{"another tag is left alone", img, "acme/api:staging", d1, true, imageref.PinTagAndDigest, "", SkipOtherTag},
		{"a digest-only reference says no tag, so it is left alone", img, "acme/api@" + d2, d1, true, imageref.PinTagAndDigest, "", SkipOtherTag},
		{"garbage is left alone", img, "Not An Image", d1, true, imageref.PinTagAndDigest, "", SkipUnparsable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to, skip := PinRendered(tc.img, tc.live, tc.recorded, tc.hasRecord, tc.format)
			if to != tc.want || skip != tc.skip {
				t.Errorf("PinRendered(%q) = %q, %q; want %q, %q", tc.live, to, skip, tc.want, tc.skip)
			}
		})
	}
}
