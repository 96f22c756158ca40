package refresh

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"
	specs "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/image-refresh/image-refresh/internal/config"
)

// V3: a digest is pinned or recorded only if it serves every platform the
// nodes its targets can run on need. A build that drops linux/arm64 from
// its index, or a single-platform image pushed from a laptop, would
// otherwise move the pin and leave every pod on the other nodes in
// ErrImagePull ("no match for platform in manifest") or "exec format
// error".

// Platform is an operating system, architecture and variant, as an
// index's descriptor, an image config or a node's labels give it.
type Platform struct {
	OS, Architecture, Variant string
}

func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

func (p Platform) spec() specs.Platform {
	return specs.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}
}

// Runs reports whether a node of platform p can run an image built for
// served, as containerd picks a manifest for its node (its default
// matching: an arm64 node runs arm64 with variant v8 or none, and arm/v8
// and below; an arm/v7 node runs arm/v7, v6 and v5; an amd64 node runs
// 386 too). A node's variant is containerd's default for its architecture
// (arm: v7, arm64: v8), as the kubelet labels none.
func (p Platform) Runs(served Platform) bool {
	return platforms.Only(p.spec()).Match(served.spec())
}

// PlatformNeed is one platform that the nodes an image's targets can run
// on need, and a node that needs it (V3).
type PlatformNeed struct {
	Platform Platform
	Node     string
	// Targets are the targets that can run on such a node.
	Targets []config.Target
}

// MissingPlatforms returns the needs no platform of served satisfies.
func MissingPlatforms(served []Platform, needs []PlatformNeed) []PlatformNeed {
	var out []PlatformNeed
	for _, n := range needs {
		if !slices.ContainsFunc(served, n.Platform.Runs) {
			out = append(out, n)
		}
	}
	return out
}

// platformNeeds returns what V3 checks img's digests against: the needs
// Observation.Needs gives for img; ok is false when V3 was not observed
// for it (nothing to check this pass).
func (d *decision) platformNeeds(img config.Image) ([]PlatformNeed, bool) {
	needs, ok := d.obs.Needs[img.Name]
	return needs, ok
}

// platformsMissing applies V3 to digest of img: the needs it does not
// serve, and whether the check applies at all. A digest V3 must check
// whose platforms were not read this pass is missing them all
// (fail-closed): the pass reads them, or fails the image's resolution
// (R1), before the engine decides.
func (d *decision) platformsMissing(img config.Image, digest string) (missing []PlatformNeed, served []Platform, checked bool) {
	needs, ok := d.platformNeeds(img)
	if !ok {
		return nil, nil, false
	}
	served, read := d.obs.Served[digest]
	if !read {
		return needs, nil, true
	}
	return MissingPlatforms(served, needs), served, true
}

// platformFirst applies V3 to a first observation (R5): only a digest
// that serves every needed platform is recorded. It reports whether
// latest may be recorded.
func (d *decision) platformFirst(img config.Image, latest string) (recordable bool) {
	missing, served, checked := d.platformsMissing(img, latest)
	if !checked || len(missing) == 0 {
		return true
	}
	f := d.platformFinding(img, latest, missing, served, "nothing is recorded and no target is touched until the tag serves them")
	d.find(f)
	for _, t := range img.Targets {
		d.row(img, t, StatePlatformMissing, f.Message, f.Remediation)
	}
	return false
}

// platformHold is V3 for a digest change: a digest that lacks a platform
// the nodes need is never pinned or recorded; the image holds its current
// pin (R7 keeps it).
func (d *decision) platformHold(img config.Image, recorded, latest string) *hold {
	missing, served, checked := d.platformsMissing(img, latest)
	if !checked || len(missing) == 0 {
		return nil
	}
	return &hold{state: StatePlatformMissing, finding: d.platformFinding(img, latest, missing, served, "held on the recorded digest "+recorded)}
}

// platformFinding names the digest, each missing platform with a node that
// needs it and the targets that can run there, and what it serves.
func (d *decision) platformFinding(img config.Image, digest string, missing []PlatformNeed, served []Platform, held string) Finding {
	var parts, names []string
	for _, m := range missing {
		names = append(names, m.Platform.String())
		parts = append(parts, fmt.Sprintf("%s (node %s, where %s can run)", m.Platform, m.Node, d.namedAll(m.Targets)))
	}
	servedText := "no platform could be read"
	if served != nil {
		s := make([]string, 0, len(served))
		for _, p := range served {
			s = append(s, p.String())
		}
		servedText = "it serves " + strings.Join(s, ", ")
		if len(s) == 0 {
			servedText = "it names no platform"
		}
	}
	msg := fmt.Sprintf("the registry serves %s:%s at %s, which lacks platform(s) the nodes need: %s; %s; %s",
		img.Repository, img.Tag, digest, strings.Join(parts, "; "), servedText, held)
	rem := fmt.Sprintf("publish a build of %s:%s for %s (a multi-platform image index, e.g. docker buildx build --platform with every platform of your nodes); or, if those targets must not run there, keep them off those nodes with a nodeSelector or required node affinity on kubernetes.io/arch or kubernetes.io/os",
		img.Repository, img.Tag, strings.Join(names, ", "))
	return Finding{Severity: SeverityError, Reason: ReasonPlatformMissing, Image: img.Name, NeedsHuman: true, Message: msg, Remediation: rem}
}

// rollbackPlatformsMissing reports whether V2's rollback target of img,
// its recorded digest, lacks a platform the nodes need now (a node of
// another platform joined since it was recorded): the rollback does not
// pin it (V3), and says so. A target whose platforms were not read is
// rolled back: retreating from a failed digest is the safe way.
func (d *decision) rollbackPlatformsMissing(img config.Image, recorded string) bool {
	if _, read := d.obs.Served[recorded]; !read {
		return false
	}
	missing, served, checked := d.platformsMissing(img, recorded)
	if !checked || len(missing) == 0 {
		return false
	}
	f := d.platformFinding(img, recorded, missing, served,
		"it is the recorded digest a failed rollout rolls back to (onFailedRollout: rollback): the rollback does not retreat to it, and R10's attempts and lockout hold the group instead")
	d.find(f)
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.Image == img.Name {
			r.Also = append(r.Also, Beside{State: StatePlatformMissing, Message: f.Message, Remediation: f.Remediation})
		}
	}
	return true
}
