package config

import (
	"fmt"
	"strings"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// promotions checks every group's promotion (P1): the leader is another
// group of the config, the chain it starts has no cycle, and each image of
// the follower is an image of the leader (same repository and tag), which
// Promotion.Images then maps.
func (v *validator) promotions(groups []Group) {
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
		if pr.After == "" {
			v.errorf(p+".after", "is required: the name of the group this one follows")
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
