package notify

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// Hint names a repository:tag that a sender says was pushed. It is only a
// reason to ask the registry now: the digest a body may carry is never read
// (R1).
type Hint struct {
	// Repository with its registry host, e.g. "127.0.0.1:5000/acme/api" or
	// "docker.io/acme/api".
	Repository string
	Tag        string
}

func (h Hint) String() string { return h.Repository + ":" + h.Tag }

// parser reads one sender's request body; header is the request's header
// (GitHub names its event kind there).
type parser func(header http.Header, body []byte) ([]Hint, error)

// Sender is one kind of registry that sends push notifications, served on
// its own path.
type Sender struct {
	Name  string // the path segment: /distribution, /harbor, …
	parse parser
	// hmac: the sender signs the body with the shared secret (GitHub's
	// X-Hub-Signature-256) instead of sending a header we choose.
	hmac bool
}

// Senders lists every sender, in the order of docs/notifications.md.
func Senders() []Sender {
	return []Sender{
		{Name: "distribution", parse: parseDistribution},
		{Name: "harbor", parse: parseHarbor},
		{Name: "dockerhub", parse: parseDockerHub},
		{Name: "github", parse: parseGitHub, hmac: true},
		{Name: "gar", parse: parseGAR},
		{Name: "acr", parse: parseACR},
	}
}

// registryEvent is one event of CNCF Distribution's notification envelope
// (media type application/vnd.docker.distribution.events.v2+json); Azure
// Container Registry sends the same shape, one event per request.
type registryEvent struct {
	Action string `json:"action"`
	Target struct {
		Repository string `json:"repository"`
		Tag        string `json:"tag"`
	} `json:"target"`
	Request struct {
		Host string `json:"host"`
	} `json:"request"`
}

// hint returns the event's hint: a manifest pushed by tag. Blob pushes,
// pulls, deletes and pushes by digest carry no tag and are no hint; nor
// is an event without the registry host it was pushed to, since the host
// is part of what names an image.
func (e registryEvent) hint() (Hint, bool) {
	if e.Action != "push" || e.Target.Tag == "" || e.Target.Repository == "" || e.Request.Host == "" {
		return Hint{}, false
	}
	return Hint{Repository: e.Request.Host + "/" + e.Target.Repository, Tag: e.Target.Tag}, true
}

func parseDistribution(_ http.Header, body []byte) ([]Hint, error) {
	var env struct {
		Events []registryEvent `json:"events"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("distribution envelope: %w", err)
	}
	var out []Hint
	for _, e := range env.Events {
		if h, ok := e.hint(); ok {
			out = append(out, h)
		}
	}
	return out, nil
}

func parseACR(_ http.Header, body []byte) ([]Hint, error) {
	var e registryEvent
	if err := json.Unmarshal(body, &e); err != nil {
		return nil, fmt.Errorf("acr event: %w", err)
	}
	if h, ok := e.hint(); ok {
		return []Hint{h}, nil
	}
	return nil, nil
}

// harborData is the event data of a Harbor webhook, in the Default format
// (event_data) and the CloudEvents format (data).
type harborData struct {
	Resources []struct {
		Tag         string `json:"tag"`
		ResourceURL string `json:"resource_url"` // "host/project/repo:tag"
	} `json:"resources"`
}

func parseHarbor(_ http.Header, body []byte) ([]Hint, error) {
	var ev struct {
		Type      string     `json:"type"`
		EventData harborData `json:"event_data"`
		Data      harborData `json:"data"` // CloudEvents format
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("harbor webhook: %w", err)
	}
	data := ev.EventData
	switch ev.Type {
	case "PUSH_ARTIFACT":
	case "harbor.artifact.pushed":
		data = ev.Data
	default:
		return nil, nil
	}
	var out []Hint
	for _, r := range data.Resources {
		// resource_url names the registry host Harbor is reached at.
		ref, err := imageref.Parse(r.ResourceURL)
		if err != nil || ref.Tag == "" {
			continue
		}
		out = append(out, Hint{Repository: ref.Repository, Tag: ref.Tag})
	}
	return out, nil
}

func parseDockerHub(_ http.Header, body []byte) ([]Hint, error) {
	var ev struct {
		PushData struct {
			Tag string `json:"tag"`
		} `json:"push_data"`
		Repository struct {
			RepoName string `json:"repo_name"` // "owner/name"
		} `json:"repository"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("docker hub webhook: %w", err)
	}
	if ev.PushData.Tag == "" || ev.Repository.RepoName == "" {
		return nil, nil
	}
	return []Hint{{Repository: "docker.io/" + ev.Repository.RepoName, Tag: ev.PushData.Tag}}, nil
}

// githubPackage is the package of GitHub's package (and older
// registry_package) webhook event.
type githubPackage struct {
	Name        string `json:"name"`
	Namespace   string `json:"namespace"`
	PackageType string `json:"package_type"`
	Owner       struct {
		Login string `json:"login"`
	} `json:"owner"`
	PackageVersion struct {
		ContainerMetadata struct {
			Tag struct {
				Name string `json:"name"`
			} `json:"tag"`
		} `json:"container_metadata"`
	} `json:"package_version"`
}

func parseGitHub(header http.Header, body []byte) ([]Hint, error) {
	switch header.Get("X-GitHub-Event") {
	case "package", "registry_package":
	default:
		return nil, nil // ping and every other event: no hint
	}
	var ev struct {
		Action          string         `json:"action"`
		Package         *githubPackage `json:"package"`
		RegistryPackage *githubPackage `json:"registry_package"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("github package event: %w", err)
	}
	p := ev.Package
	if p == nil {
		p = ev.RegistryPackage
	}
	if p == nil || (ev.Action != "published" && ev.Action != "updated") || !strings.EqualFold(p.PackageType, "container") {
		return nil, nil
	}
	owner := p.Namespace
	if owner == "" {
		owner = p.Owner.Login
	}
	tag := p.PackageVersion.ContainerMetadata.Tag.Name
	if owner == "" || p.Name == "" || tag == "" {
		return nil, nil
	}
	// GitHub Container Registry names are lower case; the event keeps the
	// owner's login as spelled.
	return []Hint{{Repository: "ghcr.io/" + strings.ToLower(owner) + "/" + strings.ToLower(p.Name), Tag: tag}}, nil
}

// parseGAR reads a Pub/Sub push request of Artifact Registry's "gcr"
// topic: message.data is the base64 of {"action":"INSERT","digest":…,
// "tag":"HOST/PROJECT/REPO/IMAGE:TAG"}.
func parseGAR(_ http.Header, body []byte) ([]Hint, error) {
	var push struct {
		Message struct {
			Data string `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(body, &push); err != nil {
		return nil, fmt.Errorf("pub/sub push request: %w", err)
	}
	data, err := base64.StdEncoding.DecodeString(push.Message.Data)
	if err != nil {
		return nil, fmt.Errorf("pub/sub message data: %w", err)
	}
	var msg struct {
		Action string `json:"action"`
		Tag    string `json:"tag"`
	}
	if err := json.Unmarshal(data, &msg); err != nil {
		return nil, fmt.Errorf("artifact registry message: %w", err)
	}
	if msg.Action != "INSERT" || msg.Tag == "" {
		return nil, nil
	}
	ref, err := imageref.Parse(msg.Tag)
	if err != nil || ref.Tag == "" {
		return nil, nil
	}
	return []Hint{{Repository: ref.Repository, Tag: ref.Tag}}, nil
}
