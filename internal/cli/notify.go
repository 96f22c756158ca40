package cli

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/image-refresh/image-refresh/internal/notify"
)

// NotifyTokenEnv is the environment variable that may hold the shared
// secret of push notifications; it is never a flag value, since argv is
// visible to every user of the node (R20).
const NotifyTokenEnv = "IMAGE_REFRESH_NOTIFY_TOKEN"

// notifyFlags are the flags of the push notification endpoint
// (docs/notifications.md).
type notifyFlags struct {
	port      int
	host      string
	tokenFile string
}

func (n *notifyFlags) bind(cmd interface {
	IntVar(*int, string, int, string)
	StringVar(*string, string, string, string)
}) {
	cmd.IntVar(&n.port, "notify-port", 0, "serve push notifications of registries (docs/notifications.md) on this port; 0 disables it")
	cmd.StringVar(&n.host, "notify-host", "", "address the notification endpoint listens on; default: every interface")
	cmd.StringVar(&n.tokenFile, "notify-token-file", "", "file holding the shared secret of push notifications (else the environment variable "+NotifyTokenEnv+")")
}

// token validates the flags and returns the shared secret ("" when the
// endpoint is off). Errors name what is wrong, never the secret.
func (n *notifyFlags) token() (string, error) {
	switch {
	case n.port < 0 || n.port > 65535:
		return "", invalid("--notify-port must be within 0..65535, got %d", n.port)
	case n.port == 0:
		if n.tokenFile != "" {
			return "", invalid("--notify-token-file is read only with --notify-port")
		}
		return "", nil
	}
	env, fromEnv := os.LookupEnv(NotifyTokenEnv)
	var tok, from string
	switch {
	case n.tokenFile != "" && fromEnv:
		return "", invalid("the notification secret is set twice: --notify-token-file and %s; keep one", NotifyTokenEnv)
	case n.tokenFile != "":
		b, err := os.ReadFile(n.tokenFile)
		if err != nil {
			return "", invalid("--notify-token-file: %v", err)
		}
		tok, from = string(b), "--notify-token-file "+n.tokenFile
	case fromEnv:
		tok, from = env, NotifyTokenEnv
	default:
		return "", invalid("--notify-port needs the shared secret of push notifications: --notify-token-file FILE or the environment variable %s", NotifyTokenEnv)
	}
	tok = strings.TrimSpace(tok)
	if len(tok) < 16 || strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~") != "" {
		return "", invalid("the notification secret from %s must be at least 16 characters of A-Z a-z 0-9 - . _ ~ (it may be sent as a path segment)", from)
	}
	return tok, nil
}

// setup serves push notifications on mgr: every replica listens, and the
// leader's poller asks the registry (notify.Server).
func (n *notifyFlags) setup(mgr ctrl.Manager, token string, k notify.Kicker, reg prometheus.Registerer, log *slog.Logger) error {
	h := notify.NewHandler(token, k, notify.NewMetrics(reg), log)
	addr := net.JoinHostPort(n.host, strconv.Itoa(n.port))
	if err := mgr.Add(&notify.Server{Addr: addr, Handler: h}); err != nil {
		return fmt.Errorf("serve push notifications: %w", err)
	}
	return nil
}
