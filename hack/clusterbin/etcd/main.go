// Command etcd is etcd's own server main, built from the version of
// go.etcd.io/etcd/server/v3 that kube-apiserver v1.37 is tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
