package config

import (
	"math"
	"time"
)

// Group returns the group with that name.
func (c *Config) Group(name string) (*Group, bool) {
	for i := range c.Groups {
		if c.Groups[i].Name == name {
			return &c.Groups[i], true
		}
	}
	return nil, false
}

// RegistryFor returns the settings for a registry host. Hosts compare as an
// image reference reads them, so "docker.io" matches "index.docker.io".
func (c *Config) RegistryFor(host string) (Registry, bool) {
	want, ok := canonicalHost(host)
	if !ok {
		return Registry{}, false
	}
	for _, r := range c.Registries {
		if got, ok := canonicalHost(r.Host); ok && got == want {
			return r, true
		}
	}
	return Registry{}, false
}

// EffectiveTickTimeout is TickTimeout, or when that is 0, room for one
// rollout wait per distinct target workload in the config plus one, and
// tickSlack for the calls around them (R14).
func (c *Config) EffectiveTickTimeout() time.Duration {
	if c.TickTimeout > 0 {
		return c.TickTimeout
	}
	// Every workload of every group may be waited on once (R14), anchors
	// included; a group that rolls back a failed rollout (V2) twice.
	seen := map[Workload]bool{}
	again := 0
	for _, g := range c.Groups {
		for _, w := range g.Workloads() {
			seen[w] = true
			if g.OnFailedRollout == OnFailedRolloutRollback {
				again++
			}
		}
	}
	n := time.Duration(len(seen) + again + 1)
	if c.RolloutTimeout > 0 && c.RolloutTimeout > (math.MaxInt64-tickSlack)/n {
		return math.MaxInt64 // saturate rather than overflow to a past deadline
	}
	return n*c.RolloutTimeout + tickSlack
}
