package localcluster

import (
	"context"
	"time"
)

// CheckNodesRunPods is checkNodesRunPods, for the harness tests.
func (c *Cluster) CheckNodesRunPods(ctx context.Context, nodes []string, timeout time.Duration) error {
	return c.checkNodesRunPods(ctx, nodes, timeout)
}

// StopImageAgent stops node's image agent only; its kwok goes on.
func (c *Cluster) StopImageAgent(node string) error { return c.stopAgent(node) }

// StartNodeAgain starts whatever of node's agent and kwok is not running.
func (c *Cluster) StartNodeAgain(node string) error {
	i, err := c.nodeIndex(node)
	if err != nil {
		return err
	}
	return c.startNode(node, i)
}

// SetSysctlPaths points the sysctl record and restore at a test's files
// until the returned function puts the real ones back.
func SetSysctlPaths(root, record, slots string) (restore func()) {
	r, rec, s := sysctlRoot, sysctlRecord, slotFiles
	sysctlRoot, sysctlRecord, slotFiles = root, record, slots
	return func() { sysctlRoot, sysctlRecord, slotFiles = r, rec, s }
}

// RecordSysctls and RestoreSysctls are recordSysctls and restoreSysctls.
func RecordSysctls() error  { return recordSysctls() }
func RestoreSysctls() error { return restoreSysctls() }

// ClaimRealNodeNetwork claims a real-node slot and lays its network only
// (namespace, veth, addresses, routes), no process; TearDown undoes it.
func ClaimRealNodeNetwork(runDir, name string) (*RealNode, error) {
	rn, err := claimRealNode(runDir, name)
	if err != nil {
		return nil, err
	}
	if err := rn.setupNetwork(); err != nil {
		_ = rn.teardown(nil)
		return nil, err
	}
	return rn, nil
}

// TearDown is teardown with no cluster processes to stop.
func (rn *RealNode) TearDown() error { return rn.teardown(nil) }
