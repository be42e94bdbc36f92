// landfall-test-apiserver: the Kubernetes API server the kube backend's tests run against.
//
// It is apiextensions-apiserver (the CRD server kube-apiserver embeds, so the Metal3 and BPA
// resources are served from their upstream CRDs) with the core resources the gateway reads and
// writes added beside it, each stored in etcd through the API machinery's generic registry:
//
//   - v1: namespaces, nodes, pods (with the eviction subresource), secrets, configmaps, services
//   - policy/v1: poddisruptionbudgets
//   - apps/v1: deployments, daemonsets, statefulsets
//   - batch/v1: jobs
//
// Requests, watches, server-side apply, field selectors and errors are the real API server's.
// What a kube-apiserver adds on top of storage (object validation, defaulting, controllers) is
// left out: a test plays the controllers it needs (the kubelet's Node status, the disruption
// controller's PodDisruptionBudget status), as it plays the Metal3 operator. The eviction
// subresource is written here to the documented behaviour of kube-apiserver's: it honours the
// pod's disruption budget and answers 429 when the budget allows no disruption.
//
// It takes apiextensions-apiserver's flags unchanged.
package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	extensionsserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/component-base/cli"
	"k8s.io/kube-openapi/pkg/common"

	coreopenapi "landfall.test/apiserver/openapi"
)

func main() {
	ctx := genericapiserver.SetupSignalContext()
	os.Exit(cli.Run(command(ctx)))
}

func command(ctx context.Context) *cobra.Command {
	o := options.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	cmd := &cobra.Command{
		Use:   "landfall-test-apiserver",
		Short: "apiextensions-apiserver with the core resources landfall's kube backend uses",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.ServerRunOptions.ComponentGlobalsRegistry.Set()
		},
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return run(c.Context(), o)
		},
	}
	cmd.SetContext(ctx)
	o.AddFlags(cmd.Flags())
	return cmd
}

func run(ctx context.Context, o *options.CustomResourceDefinitionsServerOptions) error {
	config, err := o.Config()
	if err != nil {
		return err
	}
	// Server-side apply types objects through the OpenAPI models: the core ones join the CRD
	// server's (client-go's scheme, which names them, knows every core kind already).
	config.GenericConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(
		openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(definitions),
		openapinamer.NewDefinitionNamer(extensionsserver.Scheme, scheme.Scheme),
	)
	completed := config.Complete()
	// apiextensions-apiserver leaves the list of groups (/apis) to kube-apiserver's aggregator;
	// standing alone, this server lists its own (what a gateway's discovery reads).
	completed.GenericConfig.EnableDiscovery = true
	server, err := completed.New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}
	if err := installCore(server.GenericAPIServer, config.GenericConfig.RESTOptionsGetter); err != nil {
		return err
	}
	return server.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}

func definitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := generatedopenapi.GetOpenAPIDefinitions(ref)
	for name, def := range coreopenapi.GetOpenAPIDefinitions(ref) {
		defs[name] = def
	}
	return defs
}
