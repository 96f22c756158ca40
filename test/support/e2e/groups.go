package e2e

import (
	"fmt"
	"strings"
)

// The config builders below write the YAML of a config's groups, as the
// tests wrote it out by hand: Groups(GroupOf(..., ImageOf(..., Target(...)))).
// {{ns}} and {{reg}} are left for Env.Config to fill in.

// Groups is the config of the groups gs, each written by GroupOf.
func Groups(gs ...string) string { return "groups:\n" + strings.Join(gs, "") }

// GroupOf is one group: its name, its anchor (the workload kind/anchor)
// and its images, each written by ImageOf.
func GroupOf(name, kind, anchor string, images ...string) string {
	return fmt.Sprintf("  - name: %s\n    anchor: {kind: %s, namespace: {{ns}}, name: %s}\n    images:\n",
		name, kind, anchor) + strings.Join(images, "")
}

// ImageOf is one image of a group: its name, repository acme/<repo> of the
// test registry at tag, and its targets, each written by Target or
// VolumeTarget.
func ImageOf(name, repo, tag string, targets ...string) string {
	return fmt.Sprintf("      - name: %s\n        repository: {{reg}}/acme/%s\n        tag: %s\n        targets:\n",
		name, repo, tag) + strings.Join(targets, "")
}

// Target is the target container of the workload kind/name.
func Target(kind, name, container string) string {
	return fmt.Sprintf("          - {kind: %s, namespace: {{ns}}, name: %s, container: %s}\n", kind, name, container)
}

// VolumeTarget is the target image volume of the workload kind/name.
func VolumeTarget(kind, name, volume string) string {
	return fmt.Sprintf("          - {kind: %s, namespace: {{ns}}, name: %s, volume: %s}\n", kind, name, volume)
}

// OneGroup is the config of one group whose anchor is deploy and whose one
// image (repository acme/<image>:prod) has the one target deploy/container.
func OneGroup(group, image, deploy, container string) string {
	return GroupOf(group, "Deployment", deploy, ImageOf(image, image, "prod", Target("Deployment", deploy, container)))
}
