package main

import (
	"context"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// stores is a resource's storage and, when it has one, its status subresource's.
type stores struct {
	main   *registry.Store
	status *statusREST
}

// codecOptions stores a resource with this server's codec: the options the server was given
// encode apiextensions' types only.
type codecOptions struct {
	inner     generic.RESTOptionsGetter
	codec     runtime.Codec
	versioner runtime.GroupVersioner
}

func (c codecOptions) GetRESTOptions(gr schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	o, err := c.inner.GetRESTOptions(gr, example)
	if err != nil {
		return o, err
	}
	config := *o.StorageConfig
	config.Codec = c.codec
	config.EncodeVersioner = c.versioner
	o.StorageConfig = &config
	return o, nil
}

func newStores(s *runtime.Scheme, gr schema.GroupResource, r resource, options generic.RESTOptionsGetter) (*stores, error) {
	gv := schema.GroupVersion{Group: gr.Group, Version: "v1"}
	st := strategy{ObjectTyper: s, NameGenerator: names.SimpleNameGenerator, namespaced: r.namespaced, hasStatus: r.status, version: gv}
	main := &registry.Store{
		NewFunc:                   r.object,
		NewListFunc:               r.list,
		DefaultQualifiedResource:  gr,
		SingularQualifiedResource: schema.GroupResource{Group: gr.Group, Resource: strings.ToLower(r.kind)},
		CreateStrategy:            st,
		UpdateStrategy:            st,
		DeleteStrategy:            st,
		ResetFieldsStrategy:       st,
		TableConvertor:            rest.NewDefaultTableConvertor(gr),
	}
	attrs := func(obj runtime.Object) (labels.Set, fields.Set, error) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, nil, err
		}
		f := fields.Set{"metadata.name": m.GetName()}
		if r.namespaced {
			f["metadata.namespace"] = m.GetNamespace()
		}
		if r.fields != nil {
			for k, v := range r.fields(obj) {
				f[k] = v
			}
		}
		return labels.Set(m.GetLabels()), f, nil
	}
	if err := main.CompleteWithOptions(&generic.StoreOptions{RESTOptions: options, AttrFunc: attrs}); err != nil {
		return nil, err
	}
	out := &stores{main: main}
	if r.status {
		status := *main
		statusOnly := st
		statusOnly.statusOnly = true
		status.UpdateStrategy = statusOnly
		status.ResetFieldsStrategy = statusOnly
		out.status = &statusREST{store: &status}
	}
	return out, nil
}

// strategy keeps what a real API server's strategies keep apart: an update of the resource
// leaves its status alone, an update of its status leaves everything else alone, and the
// generation counts changes to anything but metadata and status. Objects are not validated.
type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	namespaced bool
	hasStatus  bool
	statusOnly bool
	version    schema.GroupVersion
}

func (s strategy) NamespaceScoped() bool { return s.namespaced }

func (s strategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetGeneration(1)
	}
}

func (s strategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	newer, older := toMap(obj), toMap(old)
	switch {
	case s.statusOnly:
		for k := range newer {
			if k != "status" && k != "metadata" {
				delete(newer, k)
			}
		}
		for k, v := range older {
			if k != "status" && k != "metadata" {
				newer[k] = v
			}
		}
	case s.hasStatus:
		if v, ok := older["status"]; ok {
			newer["status"] = v
		} else {
			delete(newer, "status")
		}
	}
	generation := older["metadata"].(map[string]interface{})["generation"]
	if !s.statusOnly && !reflect.DeepEqual(content(newer), content(older)) {
		g, _ := generation.(int64)
		generation = g + 1
	}
	if generation == nil {
		delete(newer["metadata"].(map[string]interface{}), "generation")
	} else {
		newer["metadata"].(map[string]interface{})["generation"] = generation
	}
	fromMap(newer, obj)
}

func (s strategy) Validate(context.Context, runtime.Object) field.ErrorList { return nil }

func (s strategy) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }

func (s strategy) Canonicalize(runtime.Object) {}

func (s strategy) AllowCreateOnUpdate() bool { return false }

func (s strategy) ValidateUpdate(context.Context, runtime.Object, runtime.Object) field.ErrorList {
	return nil
}

func (s strategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}

func (s strategy) AllowUnconditionalUpdate() bool { return true }

// GetResetFields names what an apply may not set here: the status of the resource, or all but
// the status of the status subresource.
func (s strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	version := fieldpath.APIVersion(s.version.String())
	switch {
	case s.statusOnly:
		return map[fieldpath.APIVersion]*fieldpath.Set{version: fieldpath.NewSet(
			fieldpath.MakePathOrDie("spec"), fieldpath.MakePathOrDie("data"), fieldpath.MakePathOrDie("stringData"))}
	case s.hasStatus:
		return map[fieldpath.APIVersion]*fieldpath.Set{version: fieldpath.NewSet(fieldpath.MakePathOrDie("status"))}
	}
	return nil
}

// content is an object without its metadata and status.
func content(m map[string]interface{}) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range m {
		if k != "metadata" && k != "status" && k != "apiVersion" && k != "kind" {
			out[k] = v
		}
	}
	return out
}

func toMap(obj runtime.Object) map[string]interface{} {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		panic(err)
	}
	if m["metadata"] == nil {
		m["metadata"] = map[string]interface{}{}
	}
	return m
}

func fromMap(m map[string]interface{}, obj runtime.Object) {
	v := reflect.ValueOf(obj).Elem()
	v.Set(reflect.Zero(v.Type()))
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, obj); err != nil {
		panic(err)
	}
}

// statusREST is a resource's status subresource: read it whole, write its status.
type statusREST struct {
	store *registry.Store
}

var _ rest.Patcher = &statusREST{}

func (r *statusREST) New() runtime.Object { return r.store.New() }

func (r *statusREST) Destroy() {}

func (r *statusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}

func (r *statusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, _ bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}

func (r *statusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}
