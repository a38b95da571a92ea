// A CoreDNS with only the plugins the balancer test needs. The upstream
// binary compiles every plugin (AWS, Azure, Google Cloud DNS SDKs among them),
// which is most of its cold build time; the test needs the kubernetes plugin,
// bind (to stay on loopback) and a readiness endpoint to wait on.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order plugins run in a server block; upstream's plugin.cfg order.
func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "log", "kubernetes"}
}

func main() {
	coremain.Run()
}
