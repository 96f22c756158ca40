package pass

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// checkPlatforms fills V3's observation for img's new digest res (about to
// be recorded or pinned): the platforms it serves, looked up once per
// digest per process (digests are immutable: never per poll), and the
// platforms the nodes its targets can run on need, from the node list
// (`run`'s cache, or one LIST). A registry that could not be read, or a
// node list that failed, is a read failure of the image (R1), never a
// verdict: the returned resolution carries it.
func (r *Runner) checkPlatforms(ctx context.Context, img config.Image, res refresh.Resolution, objs map[config.Workload]*workload.Object, nodes func() ([]workload.Node, error), kc func() authn.Keychain, obs *refresh.Observation) refresh.Resolution {
	if r.Nodes == nil {
		return res
	}
	needs, err := platformNeeds(img, objs, nodes)
	if err != nil {
		return refresh.Resolution{Err: fmt.Errorf("the platforms its nodes need (V3): %w", err), Ask: res.Ask}
	}
	served, err := r.served(ctx, img.Repository, res.Digest, kc)
	if err != nil {
		return refresh.Resolution{Err: fmt.Errorf("read the platforms %s@%s serves: %w", img.Repository, res.Digest, err), Ask: res.Ask}
	}
	addPlatforms(obs, img, needs, res.Digest, served)
	return res
}

// checkRollbackPlatforms fills V3's observation for the digest V2 rolls
// img back to, its record, while a digest change is in flight with
// onFailedRollout: rollback (a target is on another digest). A failure
// is only logged: a rollback whose target was not checked retreats, the
// safe way.
func (r *Runner) checkRollbackPlatforms(ctx context.Context, g config.Group, img config.Image, keys state.Keys, objs map[config.Workload]*workload.Object, nodes func() ([]workload.Node, error), kc func() authn.Keychain, obs *refresh.Observation) {
	recorded := obs.Anchor[keys.Record(img.Name)]
	if r.Nodes == nil || g.OnFailedRollout != config.OnFailedRolloutRollback || img.PinnedDigest != "" {
		return
	}
	if _, err := imageref.ParseDigest(recorded); err != nil {
		return
	}
	moved := slices.ContainsFunc(img.Targets, func(t config.Target) bool {
		on := imageref.DigestOf(obs.Workloads[t.Workload()].Containers[t.Container].Image)
		return on != "" && on != recorded
	})
	if !moved {
		return
	}
	needs, err := platformNeeds(img, objs, nodes)
	if err == nil {
		var served []refresh.Platform
		if served, err = r.served(ctx, img.Repository, recorded, kc); err == nil {
			addPlatforms(obs, img, needs, recorded, served)
			return
		}
	}
	r.Log.Warn("cannot tell which platforms the digest a failed rollout rolls back to serves; a rollback retreats to it unchecked",
		"group", g.Name, "image", img.Name, "digest", recorded, "error", err)
}

func addPlatforms(obs *refresh.Observation, img config.Image, needs []refresh.PlatformNeed, digest string, served []refresh.Platform) {
	if obs.Needs == nil {
		obs.Needs = map[string][]refresh.PlatformNeed{}
	}
	if obs.Served == nil {
		obs.Served = map[string][]refresh.Platform{}
	}
	obs.Needs[img.Name] = needs
	obs.Served[digest] = served
}

// platformNeeds lists the platforms the nodes img's targets can run on
// need (their pod templates' nodeSelector and required node affinity),
// each with the first such node by name and the targets that can run
// there. A node whose labels do not say its os and architecture is not
// counted; a target whose workload was not read adds nothing.
func platformNeeds(img config.Image, objs map[config.Workload]*workload.Object, listNodes func() ([]workload.Node, error)) ([]refresh.PlatformNeed, error) {
	nodes, err := listNodes()
	if err != nil {
		return nil, err
	}
	needs := []refresh.PlatformNeed{}
	for _, t := range img.Targets {
		obj, ok := objs[t.Workload()]
		if !ok {
			continue
		}
		for _, n := range nodes {
			os, arch, ok := n.Platform()
			if !ok || !obj.RunsOn(n) {
				continue
			}
			p := refresh.Platform{OS: os, Architecture: arch}
			i := slices.IndexFunc(needs, func(x refresh.PlatformNeed) bool { return x.Platform == p })
			if i < 0 {
				needs = append(needs, refresh.PlatformNeed{Platform: p, Node: n.Name})
				i = len(needs) - 1
			}
			if !slices.Contains(needs[i].Targets, t) {
				needs[i].Targets = append(needs[i].Targets, t)
			}
		}
	}
	return needs, nil
}

// served returns the platforms repo@digest serves, from the registry once
// per digest per process (digests are immutable). A failed read is not
// kept: the next pass asks again.
func (r *Runner) served(ctx context.Context, repo, digest string, kc func() authn.Keychain) ([]refresh.Platform, error) {
	got, ok := r.memo().served.get(digest)
	if ok {
		return got, nil
	}
	ps, err := r.Resolver.ServedPlatforms(ctx, repo, digest, kc())
	if err != nil {
		return nil, err
	}
	got = make([]refresh.Platform, 0, len(ps))
	for _, p := range ps {
		got = append(got, refresh.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant})
	}
	r.memo().served.add(digest, got)
	return got, nil
}

// nodesOnce lists the nodes at most once per pass over a group (Observe),
// on the first call: a pass without a new digest lists none.
func (r *Runner) nodesOnce(ctx context.Context) func() ([]workload.Node, error) {
	var (
		nodes []workload.Node
		err   error
		done  bool
	)
	return func() ([]workload.Node, error) {
		if !done {
			nodes, err = r.Nodes.Nodes(ctx)
			done = true
		}
		return nodes, err
	}
}
