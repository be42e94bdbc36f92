package main

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
)

// A resource this server stores: its kind, and what else it serves.
type resource struct {
	plural, kind string
	namespaced   bool
	status       bool
	// Field selectors beyond metadata.name and metadata.namespace, read off the object.
	fields func(runtime.Object) map[string]string
	object func() runtime.Object
	list   func() runtime.Object
}

type group struct {
	version   schema.GroupVersion
	resources []resource
	// Registers the group's external types (and the meta types) with a scheme.
	install func(*runtime.Scheme) error
}

func podFields(o runtime.Object) map[string]string {
	p := o.(*corev1.Pod)
	return map[string]string{"spec.nodeName": p.Spec.NodeName, "status.phase": string(p.Status.Phase)}
}

func nodeFields(o runtime.Object) map[string]string {
	return map[string]string{"spec.unschedulable": fmt.Sprint(o.(*corev1.Node).Spec.Unschedulable)}
}

func secretFields(o runtime.Object) map[string]string {
	return map[string]string{"type": string(o.(*corev1.Secret).Type)}
}

var groups = []group{
	{corev1.SchemeGroupVersion, []resource{
		{"namespaces", "Namespace", false, true, nil, func() runtime.Object { return &corev1.Namespace{} }, func() runtime.Object { return &corev1.NamespaceList{} }},
		{"nodes", "Node", false, true, nodeFields, func() runtime.Object { return &corev1.Node{} }, func() runtime.Object { return &corev1.NodeList{} }},
		{"pods", "Pod", true, true, podFields, func() runtime.Object { return &corev1.Pod{} }, func() runtime.Object { return &corev1.PodList{} }},
		{"secrets", "Secret", true, false, secretFields, func() runtime.Object { return &corev1.Secret{} }, func() runtime.Object { return &corev1.SecretList{} }},
		{"configmaps", "ConfigMap", true, false, nil, func() runtime.Object { return &corev1.ConfigMap{} }, func() runtime.Object { return &corev1.ConfigMapList{} }},
		{"services", "Service", true, true, nil, func() runtime.Object { return &corev1.Service{} }, func() runtime.Object { return &corev1.ServiceList{} }},
	}, corev1.AddToScheme},
	{policyv1.SchemeGroupVersion, []resource{
		{"poddisruptionbudgets", "PodDisruptionBudget", true, true, nil, func() runtime.Object { return &policyv1.PodDisruptionBudget{} }, func() runtime.Object { return &policyv1.PodDisruptionBudgetList{} }},
	}, policyv1.AddToScheme},
	{appsv1.SchemeGroupVersion, []resource{
		{"deployments", "Deployment", true, true, nil, func() runtime.Object { return &appsv1.Deployment{} }, func() runtime.Object { return &appsv1.DeploymentList{} }},
		{"daemonsets", "DaemonSet", true, true, nil, func() runtime.Object { return &appsv1.DaemonSet{} }, func() runtime.Object { return &appsv1.DaemonSetList{} }},
		{"statefulsets", "StatefulSet", true, true, nil, func() runtime.Object { return &appsv1.StatefulSet{} }, func() runtime.Object { return &appsv1.StatefulSetList{} }},
	}, appsv1.AddToScheme},
	{batchv1.SchemeGroupVersion, []resource{
		{"jobs", "Job", true, true, nil, func() runtime.Object { return &batchv1.Job{} }, func() runtime.Object { return &batchv1.JobList{} }},
	}, batchv1.AddToScheme},
}

// storageScheme registers every group's external types under the group's internal version too:
// the generic registry converts to an internal version before storing, and with one Go type for
// both that conversion only sets the kind.
func storageScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	unversioned := schema.GroupVersion{Version: "v1"}
	metav1.AddToGroupVersion(s, unversioned)
	s.AddUnversionedTypes(unversioned, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{},
		&metav1.APIGroup{}, &metav1.APIResourceList{})
	for _, g := range groups {
		if err := g.install(s); err != nil {
			return nil, err
		}
		internal := schema.GroupVersion{Group: g.version.Group, Version: runtime.APIVersionInternal}
		for _, r := range g.resources {
			s.AddKnownTypeWithName(internal.WithKind(r.kind), r.object())
			s.AddKnownTypeWithName(internal.WithKind(r.kind+"List"), r.list())
		}
		for _, r := range g.resources {
			if err := s.AddFieldLabelConversionFunc(g.version.WithKind(r.kind), fieldLabels(r)); err != nil {
				return nil, err
			}
		}
	}
	// The eviction subresource takes a policy/v1 Eviction.
	s.AddKnownTypeWithName(schema.GroupVersion{Group: policyv1.GroupName, Version: runtime.APIVersionInternal}.WithKind("Eviction"), &policyv1.Eviction{})
	return s, nil
}

func fieldLabels(r resource) runtime.FieldLabelConversionFunc {
	return func(label, value string) (string, string, error) {
		switch label {
		case "metadata.name":
			return label, value, nil
		case "metadata.namespace":
			if r.namespaced {
				return label, value, nil
			}
		default:
			if r.fields != nil {
				if _, ok := r.fields(r.object())[label]; ok {
					return label, value, nil
				}
			}
		}
		return "", "", fmt.Errorf("field label not supported for %s: %s", r.plural, label)
	}
}

// installCore serves every group of `groups` from etcd, and pods' eviction subresource.
func installCore(server *genericapiserver.GenericAPIServer, options generic.RESTOptionsGetter) error {
	s, err := storageScheme()
	if err != nil {
		return err
	}
	codecs := serializer.NewCodecFactory(s)
	versions := make(schema.GroupVersions, len(groups))
	for i, g := range groups {
		versions[i] = g.version
	}
	options = codecOptions{inner: options, codec: codecs.LegacyCodec(versions...), versioner: versions}
	all := map[string]*stores{}
	infos := make([]genericapiserver.APIGroupInfo, len(groups))
	for i, g := range groups {
		storage := map[string]rest.Storage{}
		for _, r := range g.resources {
			st, err := newStores(s, g.version.WithResource(r.plural).GroupResource(), r, options)
			if err != nil {
				return fmt.Errorf("%s: %w", r.plural, err)
			}
			all[r.plural] = st
			storage[r.plural] = st.main
			if st.status != nil {
				storage[r.plural+"/status"] = st.status
			}
		}
		infos[i] = genericapiserver.NewDefaultAPIGroupInfo(g.version.Group, s, runtime.NewParameterCodec(s), codecs)
		infos[i].VersionedResourcesStorageMap[g.version.Version] = storage
	}
	infos[0].VersionedResourcesStorageMap["v1"]["pods/eviction"] = &evictionREST{pods: all["pods"], budgets: all["poddisruptionbudgets"]}
	if err := server.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, &infos[0]); err != nil {
		return err
	}
	for i := range infos[1:] {
		if err := server.InstallAPIGroup(&infos[1+i]); err != nil {
			return err
		}
	}
	return nil
}
