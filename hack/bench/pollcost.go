package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// The pollcost phase: what one poll interval costs a registry, by kind of
// request (manifest HEAD, GET /v2/ ping, token request) and in new TCP
// connections, for 1, 20 and 200 targets of one repo:tag. It drives the
// poller and the resolver exactly as `run` wires them (poller.Poller with
// Resolver.Latest and Resolver.Pace, one Resolver for the process), without
// a cluster: the targets are the poller's entries, which it merges by
// repo:tag as `run` does. Counted by the registries: the ggcr test registry
// (plain HTTP on loopback, the insecure-host path) and the real CNCF
// Distribution with htpasswd and with auth.token (its token server in
// process), each behind a counting front.

// cost is what a client spent at one registry, cumulated.
type cost struct{ heads, pings, tokens, conns int }

func (c cost) minus(o cost) cost {
	return cost{c.heads - o.heads, c.pings - o.pings, c.tokens - o.tokens, c.conns - o.conns}
}

// costRegistry is one registry under measurement.
type costRegistry struct {
	kind  string
	host  string
	hosts []registry.HostConfig
	kc    authn.Keychain
	push  func(repo string) error
	count func() cost
	stop  func()
}

func startCostRegistries() ([]costRegistry, error) {
	var out []costRegistry
	s := testregistry.New()
	if err := s.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	out = append(out, costRegistry{
		kind: "ggcr test registry (plain HTTP, anonymous)", host: s.Host(),
		push: func(repo string) error { _, err := s.PushRandomImage(repo, "prod"); return err },
		count: func() cost {
			c := cost{conns: s.Conns()}
			for _, r := range s.Requests() {
				c.add(r.Method, r.Path)
			}
			return c
		},
		stop: func() { _ = s.Close() },
	})
	for _, token := range []bool{false, true} {
		dir, err := os.MkdirTemp("", "image-refresh-bench-distribution-")
		if err != nil {
			return nil, err
		}
		d, err := distribution.Start(context.Background(), distribution.Options{Dir: dir, TokenAuth: token})
		if err != nil {
			return nil, err
		}
		f, err := d.StartFront()
		if err != nil {
			return nil, err
		}
		kind := "Distribution, TLS + htpasswd"
		if token {
			kind = "Distribution, TLS + auth.token"
		}
		out = append(out, costRegistry{
			kind: kind, host: f.Host,
			hosts: []registry.HostConfig{{Host: f.Host, CAFile: d.CAFile}},
			kc:    staticKeychain{host: f.Host, user: d.User, pass: d.Password},
			push:  func(repo string) error { _, err := d.PushRandomImage(repo, "prod"); return err },
			count: func() cost {
				c := cost{conns: f.Conns()}
				if d.Token != nil {
					c.tokens, c.conns = d.Token.Requests(), c.conns+d.Token.Conns()
				}
				for _, r := range f.Requests() {
					c.add(r.Method, r.Path)
				}
				return c
			},
			stop: func() { _ = d.Stop(); _ = os.RemoveAll(dir) },
		})
	}
	return out, nil
}

func (c *cost) add(method, path string) {
	switch {
	case method == http.MethodHead && strings.Contains(path, "/manifests/"):
		c.heads++
	case method == http.MethodGet && path == "/v2/":
		c.pings++
	case path == testregistry.TokenPath:
		c.tokens++
	}
}

type staticKeychain struct{ host, user, pass string }

func (k staticKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if res.RegistryStr() != k.host {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{Username: k.user, Password: k.pass}), nil
}

func measurePollCost(ctx context.Context, interval time.Duration, intervals int) ([]row, error) {
	regs, err := startCostRegistries()
	defer func() {
		for _, r := range regs {
			r.stop()
		}
	}()
	if err != nil {
		return nil, err
	}
	var rows []row
	for _, reg := range regs {
		for _, n := range fleetSizes {
			repo := fmt.Sprintf("acme/cost%d", n)
			if err := reg.push(repo); err != nil {
				return nil, err
			}
			res, err := registry.NewResolver(registry.Options{Hosts: reg.hosts, UserAgent: "image-refresh/bench"})
			if err != nil {
				return nil, err
			}
			kc := reg.kc
			p := &poller.Poller{
				Interval: interval,
				Resolve: func(ctx context.Context, img config.Image) (string, error) {
					// A new keychain object per poll, as the reconciler
					// rebuilds it from the pull secrets.
					return res.Latest(ctx, img.Repository, img.Tag, registry.Keychain(kc))
				},
				Pace: func(img config.Image, d time.Duration) time.Duration { return res.Pace(img.Repository, d) },
			}
			for i := range n {
				p.Add(config.Image{Name: fmt.Sprintf("t%d", i), Repository: reg.host + "/" + repo, Tag: "prod"})
			}
			before := reg.count()
			pctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); p.Run(pctx) }()
			// The first poll: wait for its HEAD.
			for reg.count().heads == before.heads && pctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(interval / 2) // measure between polls, not across one
			first := reg.count().minus(before)
			last := reg.count()
			var heads, pings, tokens, conns sample
			for range intervals {
				select {
				case <-ctx.Done():
					cancel()
					<-done
					return nil, ctx.Err()
				case <-time.After(interval):
				}
				now := reg.count()
				d := now.minus(last)
				heads, pings, tokens, conns = append(heads, float64(d.heads)), append(pings, float64(d.pings)), append(tokens, float64(d.tokens)), append(conns, float64(d.conns))
				last = now
			}
			cancel()
			<-done
			progress("pollcost: %s, %d targets: first poll %+v; per interval HEADs %v pings %v tokens %v conns %v", reg.kind, n, first, heads, pings, tokens, conns)
			rows = append(rows, row{
				Figure: fmt.Sprintf("poll cost per interval, %s, %d target(s)", reg.kind, n),
				Value:  fmt.Sprintf("HEAD %s, ping %s, token %s, new conn %s", fmtNum(heads.median()), fmtNum(pings.median()), fmtNum(tokens.median()), fmtNum(conns.median())),
				Spread: fmt.Sprintf("HEAD %s, ping %s, token %s, conn %s (min–max)",
					rangeOf(heads.min(), heads.max(), fmtNum), rangeOf(pings.min(), pings.max(), fmtNum),
					rangeOf(tokens.min(), tokens.max(), fmtNum), rangeOf(conns.min(), conns.max(), fmtNum)),
				N: fmt.Sprintf("%d intervals", intervals),
				Note: fmt.Sprintf("one repo:tag, --poll-interval %s, jitter 0, after the first poll, which cost HEAD %d, ping %d, token %d, new conn %d",
					interval, first.heads, first.pings, first.tokens, first.conns),
			})
		}
	}
	return rows, nil
}
