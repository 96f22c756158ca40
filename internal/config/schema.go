package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// The keys of the config file, one decode function per type. A key missing
// here is an unknown key in the file.

func (d *decoder) config(n *yaml.Node, c *Config) {
	d.mapping("", n, map[string]fieldFunc{
		"annotationPrefix":      d.str(&c.AnnotationPrefix),
		"rolloutTimeout":        d.duration(&c.RolloutTimeout),
		"registryTimeout":       d.duration(&c.RegistryTimeout),
		"apiTimeout":            d.duration(&c.APITimeout),
		"tickTimeout":           d.duration(&c.TickTimeout),
		"maxRefreshAttempts":    d.integer(&c.MaxRefreshAttempts),
		"maxSkipTicks":          d.integer(&c.MaxSkipTicks),
		"maxReadFailures":       d.integer(&c.MaxReadFailures),
		"maxDigestChanges":      d.integer(&c.MaxDigestChanges),
		"digestChangeWindow":    d.duration(&c.DigestChangeWindow),
		"minDigestAge":          d.duration(&c.MinDigestAge),
		"pinCheckInterval":      d.duration(&c.PinCheckInterval),
		"maxConcurrentRollouts": d.integer(&c.MaxConcurrentRollouts),
		"firstInstall":          d.str((*string)(&c.FirstInstall)),
		"pinFormat":             d.str((*string)(&c.PinFormat)),
		"failOnRunningStale":    d.boolean(&c.FailOnRunningStale),
		"installation":          d.str(&c.Installation),
		"promotionSigning": func(path string, n *yaml.Node) {
			c.PromotionSigning = &PromotionSigning{}
			d.mapping(path, n, map[string]fieldFunc{
				"keyFile":      d.str(&c.PromotionSigning.KeyFile),
				"passwordFile": d.str(&c.PromotionSigning.PasswordFile),
			})
		},
		"rolloutWindows": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				c.RolloutWindows = append(c.RolloutWindows, RolloutWindow{})
				d.window(path, n, &c.RolloutWindows[len(c.RolloutWindows)-1])
			})
		},
		"registries": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				c.Registries = append(c.Registries, Registry{})
				d.registry(path, n, &c.Registries[len(c.Registries)-1])
			})
		},
		"verification": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				c.Verification = append(c.Verification, VerificationPolicy{})
				d.verificationPolicy(path, n, &c.Verification[len(c.Verification)-1])
			})
		},
		"kinds": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				c.Kinds = append(c.Kinds, DeclaredKind{})
				k := &c.Kinds[len(c.Kinds)-1]
				d.mapping(path, n, map[string]fieldFunc{
					"group":       d.str(&k.Group),
					"version":     d.str(&k.Version),
					"kind":        d.str(&k.Kind),
					"podTemplate": d.str(&k.PodTemplate),
					"resource":    d.str(&k.Resource),
					"selector":    d.str(&k.Selector),
				})
			})
		},
		"groups": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				c.Groups = append(c.Groups, Group{})
				d.group(path, n, &c.Groups[len(c.Groups)-1])
			})
		},
	})
}

func (d *decoder) window(path string, n *yaml.Node, w *RolloutWindow) {
	d.mapping(path, n, map[string]fieldFunc{
		"days": func(path string, n *yaml.Node) {
			if !d.usable(path, n) || isNull(n) {
				return
			}
			if n.Kind != yaml.SequenceNode {
				d.fail(path, n, "expected a list of weekdays, got %s", describe(n))
				return
			}
			for i, item := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				d.lines[p] = item.Line
				var day string
				d.str(&day)(p, item)
				w.Days = append(w.Days, day)
			}
		},
		"start": d.str(&w.Start),
		"end":   d.str(&w.End),
	})
}

func (d *decoder) registry(path string, n *yaml.Node, r *Registry) {
	d.mapping(path, n, map[string]fieldFunc{
		"host":     d.str(&r.Host),
		"insecure": d.boolean(&r.Insecure),
		"caFile":   d.str(&r.CAFile),
	})
}

func (d *decoder) group(path string, n *yaml.Node, g *Group) {
	d.mapping(path, n, map[string]fieldFunc{
		"name":            d.str(&g.Name),
		"onFailedRollout": d.str((*string)(&g.OnFailedRollout)),
		"promotion": func(path string, n *yaml.Node) {
			g.Promotion = &Promotion{}
			d.mapping(path, n, map[string]fieldFunc{
				"after": d.str(&g.Promotion.After),
				"soak":  d.duration(&g.Promotion.Soak),
				"attestedBy": func(path string, n *yaml.Node) {
					a := &AttestedBy{}
					g.Promotion.AttestedBy = a
					d.mapping(path, n, map[string]fieldFunc{
						"name": d.str(&a.Name),
						"cosign": func(path string, n *yaml.Node) {
							a.Cosign = &CosignPolicy{}
							d.mapping(path, n, map[string]fieldFunc{
								"publicKeys": func(path string, n *yaml.Node) {
									d.strings(path, n, &a.Cosign.PublicKeys)
								},
								"keyless": func(path string, n *yaml.Node) {
									d.keyless(path, n, &a.Cosign.Keyless)
								},
								"trustedRoot": d.str(&a.Cosign.TrustedRoot),
							})
						},
					})
				},
				"publish": func(path string, n *yaml.Node) {
					g.Promotion.Publish = &PromotionPublish{}
					d.mapping(path, n, map[string]fieldFunc{
						"soak": d.duration(&g.Promotion.Publish.Soak),
					})
				},
			})
		},
		"anchor": func(path string, n *yaml.Node) {
			d.mapping(path, n, map[string]fieldFunc{
				"kind":      d.str(&g.Anchor.Kind),
				"namespace": d.str(&g.Anchor.Namespace),
				"name":      d.str(&g.Anchor.Name),
			})
		},
		"images": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				g.Images = append(g.Images, Image{})
				d.image(path, n, &g.Images[len(g.Images)-1])
			})
		},
	})
}

func (d *decoder) image(path string, n *yaml.Node, img *Image) {
	d.mapping(path, n, map[string]fieldFunc{
		"name":         d.str(&img.Name),
		"repository":   d.str(&img.Repository),
		"tag":          d.str(&img.Tag),
		"pinnedDigest": d.str(&img.PinnedDigest),
		"targets": func(path string, n *yaml.Node) {
			d.sequence(path, n, func(path string, n *yaml.Node) {
				img.Targets = append(img.Targets, Target{})
				d.target(path, n, &img.Targets[len(img.Targets)-1])
			})
		},
	})
}

func (d *decoder) target(path string, n *yaml.Node, t *Target) {
	var volume string
	d.mapping(path, n, map[string]fieldFunc{
		"kind":      d.str(&t.Kind),
		"namespace": d.str(&t.Namespace),
		"name":      d.str(&t.Name),
		"container": d.str(&t.Container),
		// An image volume of the pod template (K1).
		"volume": d.str(&volume),
	})
	switch {
	case volume == "":
	case t.Container != "":
		d.fail(path, n, "container and volume are exclusive: a target is one container (or init container) or one image volume")
	default:
		t.Container = VolumeKey(volume)
	}
}
