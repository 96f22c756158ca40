package config

import (
	"encoding/pem"
	"fmt"
	"os"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// promotionSigning checks the installation's name and signing key (P2):
// a name is a DNS-1123 label, and a key needs the name it signs for.
func (v *validator) promotionSigning(c *Config) {
	if c.Installation != "" {
		v.name("installation", c.Installation, "installation name (DNS-1123 label)", validation.IsDNS1123Label)
	}
	s := c.PromotionSigning
	if s == nil {
		return
	}
	if c.Installation == "" {
		v.errorf("promotionSigning", "signs promotion attestations in the name of this installation: give installation too (e.g. installation: staging)")
	}
	if s.KeyFile == "" {
		v.errorf("promotionSigning.keyFile", "missing: the PEM private key file promotion attestations are signed with (the chart mounts it)")
	}
}

// promotions checks every group's promotion (P1, P2): the leader is
// another group of the config, the chain it starts has no cycle, and each
// image of the follower is an image of the leader (same repository and
// tag), which Promotion.Images then maps; a follower of another cluster
// names its signer and its trust; a group that publishes has a key.
func (v *validator) promotions(groups []Group, c *Config) {
	index := map[string]int{}
	for i, g := range groups {
		if _, dup := index[g.Name]; !dup {
			index[g.Name] = i
		}
	}
	for i, g := range groups {
		pr := g.Promotion
		if pr == nil {
			continue
		}
		p := fmt.Sprintf("groups[%d].promotion", i)
		if pr.Soak < 0 {
			v.errorf(p+".soak", "must not be negative, got %s", pr.Soak)
		}
		if pr.Publish != nil {
			v.publish(p+".publish", pr.Publish, c)
		}
		switch {
		case pr.After != "" && pr.AttestedBy != nil:
			v.errorf(p+".attestedBy", "after and attestedBy are exclusive: a group follows a group of this config (after) or a signer in another cluster (attestedBy), not both")
			continue
		case pr.AttestedBy != nil:
			v.attestedBy(p+".attestedBy", pr.AttestedBy)
			continue
		case pr.After == "" && pr.Publish != nil:
			if pr.Soak != 0 {
				v.errorf(p+".soak", "is how long a follower waits: give after or attestedBy, or move it to publish.soak")
			}
			continue
		case pr.After == "":
			v.errorf(p+".after", "is required: the name of the group this one follows (or attestedBy: a signer in another cluster, P2)")
			continue
		}
		j, ok := index[pr.After]
		switch {
		case !ok:
			v.errorf(p+".after", "names no group of this config: %q (groups are %s)", pr.After, strings.Join(groupNames(groups), ", "))
			continue
		case j == i:
			v.errorf(p+".after", "group %q cannot follow itself", g.Name)
			continue
		}
		if cycle := promotionCycle(groups, index, i); cycle != nil {
			v.errorf(p+".after", "promotion cycle: %s", strings.Join(cycle, " → "))
			continue
		}
		leader := groups[j]
		pr.Images = map[string]string{}
		for k, img := range g.Images {
			name, found := sameImage(leader, img)
			if !found {
				v.errorf(fmt.Sprintf("groups[%d].images[%d]", i, k),
					"%s:%s is not an image of group %q, which this group follows: a follower moves only to digests its leader ran", img.Repository, img.Tag, leader.Name)
				continue
			}
			pr.Images[img.Name] = name
		}
	}
}

// publish checks a group's promotion.publish (P2).
func (v *validator) publish(p string, pub *PromotionPublish, c *Config) {
	if pub.Soak < 0 {
		v.errorf(p+".soak", "must not be negative, got %s", pub.Soak)
	}
	if c.Installation == "" || c.PromotionSigning == nil {
		v.errorf(p, "publishes signed promotion attestations: give the top-level installation (this installation's name) and promotionSigning.keyFile (the key the chart mounts)")
	}
}

// attestedBy checks a follower's signer (P2) and derives the
// verification policy V5's reader checks a digest against: the signer's
// cosign trust, one required attestation of PromotionPredicateType whose
// predicate names the installation.
func (v *validator) attestedBy(p string, a *AttestedBy) {
	ok := v.name(p+".name", a.Name, "installation name (DNS-1123 label)", validation.IsDNS1123Label)
	if a.Cosign == nil {
		v.errorf(p+".cosign", "missing: the public keys (cosign.publicKeys) or keyless identities (cosign.keyless) installation %q signs with", a.Name)
		return
	}
	if len(a.Cosign.PublicKeys) == 0 && len(a.Cosign.Keyless) == 0 {
		v.errorf(p+".cosign", "give cosign.publicKeys (PEM public key files), cosign.keyless (OIDC identities), or both")
	}
	for k, f := range a.Cosign.PublicKeys {
		if f == "" {
			v.errorf(fmt.Sprintf("%s.cosign.publicKeys[%d]", p, k), "empty file name")
		}
	}
	for k, id := range a.Cosign.Keyless {
		field := fmt.Sprintf("%s.cosign.keyless[%d]", p, k)
		if id.Issuer == "" {
			v.errorf(field+".issuer", "missing: the OIDC issuer of the signer's certificate")
		}
		if (id.Subject == "") == (id.SubjectRegExp == "") {
			v.errorf(field, "give subject or subjectRegExp (one of them): the signer's identity")
		}
	}
	if a.Cosign.TrustedRoot != "" && len(a.Cosign.Keyless) == 0 {
		v.errorf(p+".cosign.trustedRoot", "a trusted root is for keyless signatures: give cosign.keyless too")
	}
	if !ok {
		return
	}
	a.Policy = &VerificationPolicy{
		Name:   "promotion-" + a.Name,
		Cosign: a.Cosign,
		Attestations: []AttestationPolicy{{
			PredicateType: PromotionPredicateType,
			Conditions:    []string{"predicate.installation == " + strconv.Quote(a.Name)},
		}},
	}
}

// promotionCycle returns the names along a cycle that group i's chain of
// leaders runs into, or nil.
func promotionCycle(groups []Group, index map[string]int, i int) []string {
	seen := map[int]bool{}
	var path []string
	for at := i; ; {
		if seen[at] {
			return append(path, groups[at].Name)
		}
		seen[at] = true
		path = append(path, groups[at].Name)
		pr := groups[at].Promotion
		if pr == nil {
			return nil
		}
		next, ok := index[pr.After]
		if !ok {
			return nil
		}
		at = next
	}
}

// sameImage finds the image of g with img's repository (canonical) and tag.
func sameImage(g Group, img Image) (string, bool) {
	want, err := imageref.CanonicalRepository(img.Repository)
	if err != nil {
		return "", false
	}
	for _, l := range g.Images {
		got, err := imageref.CanonicalRepository(l.Repository)
		if err == nil && got == want && l.Tag == img.Tag {
			return l.Name, true
		}
	}
	return "", false
}

func groupNames(groups []Group) []string {
	out := make([]string, 0, len(groups))
	for _, g := range groups {
		out = append(out, g.Name)
	}
	return out
}

// Followers returns the names of the groups that follow group (P1).
func (c *Config) Followers(group string) []string {
	var out []string
	for _, g := range c.Groups {
		if g.Promotion != nil && g.Promotion.After == group {
			out = append(out, g.Name)
		}
	}
	return out
}

// PromotionOrder returns groups with every leader before its followers
// (P1), otherwise in their order: a tick passes a leader first, so that a
// follower reads the soak the leader's pass just kept.
func PromotionOrder(groups []Group) []Group {
	placed := map[string]bool{}
	out := make([]Group, 0, len(groups))
	var place func(g Group, depth int)
	byName := map[string]Group{}
	for _, g := range groups {
		byName[g.Name] = g
	}
	place = func(g Group, depth int) {
		if placed[g.Name] || depth > len(groups) {
			return
		}
		if g.Promotion != nil {
			if l, ok := byName[g.Promotion.After]; ok {
				place(l, depth+1)
			}
		}
		if !placed[g.Name] {
			placed[g.Name] = true
			out = append(out, g)
		}
	}
	for _, g := range groups {
		place(g, 0)
	}
	return out
}

// loadPromotion reads what P2 needs from files: the signing key (and its
// password) and each follower's trusted public keys and trusted root, and
// reports each one that fails at its field.
func (c *Config) loadPromotion(lines map[string]int) []error {
	var errs []error
	fail := func(p, msg string) {
		errs = append(errs, &FieldError{Path: p, Line: lineOf(lines, p), Msg: msg})
	}
	if s := c.PromotionSigning; s != nil {
		s.Key, s.Password = nil, nil
		if s.KeyFile != "" {
			data, err := os.ReadFile(s.KeyFile)
			if err != nil {
				fail("promotionSigning.keyFile", fmt.Sprintf("cannot read the signing key: %v", err))
			} else if block, _ := pem.Decode(data); block == nil {
				fail("promotionSigning.keyFile", fmt.Sprintf("%s holds no PEM block: want a PEM private key (as `cosign generate-key-pair` or `openssl genpkey` writes it)", s.KeyFile))
			} else {
				s.Key = data
			}
		}
		if s.PasswordFile != "" {
			data, err := os.ReadFile(s.PasswordFile)
			if err != nil {
				fail("promotionSigning.passwordFile", fmt.Sprintf("cannot read the key's password: %v", err))
			} else {
				s.Password = []byte(strings.TrimRight(string(data), "\r\n"))
			}
		}
	}
	for i := range c.Groups {
		pr := c.Groups[i].Promotion
		if pr == nil || pr.AttestedBy == nil || pr.AttestedBy.Cosign == nil {
			continue
		}
		cs := pr.AttestedBy.Cosign
		p := fmt.Sprintf("groups[%d].promotion.attestedBy.cosign", i)
		cs.Keys, cs.TrustedRootJSON = nil, nil
		if cs.TrustedRoot != "" {
			data, msg := readTrustedRoot(cs.TrustedRoot)
			if msg != "" {
				fail(p+".trustedRoot", msg)
			}
			cs.TrustedRootJSON = data
		}
		for k, f := range cs.PublicKeys {
			if f == "" {
				continue // reported by validation
			}
			der, msg := readPublicKey(f)
			if msg != "" {
				fail(fmt.Sprintf("%s.publicKeys[%d]", p, k), msg)
				continue
			}
			cs.Keys = append(cs.Keys, PublicKey{File: f, DER: der})
		}
	}
	return errs
}

// Publishes reports whether any group publishes promotion attestations
// (P2).
func (c *Config) Publishes() bool {
	for _, g := range c.Groups {
		if g.Promotion != nil && g.Promotion.Publish != nil {
			return true
		}
	}
	return false
}
