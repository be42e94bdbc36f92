package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/rest"
)

// evictionREST is `pods/{name}/eviction`: a pod is deleted unless its disruption budget allows
// no disruption now, and then the answer is 429 with the budget named, as kube-apiserver's is.
// A pod that is not running, or already going, is not held by any budget. The budget's status
// (what it allows) is the disruption controller's to write; here a test writes it.
type evictionREST struct {
	pods    *stores
	budgets *stores
}

var (
	_ rest.NamedCreater             = &evictionREST{}
	_ rest.GroupVersionKindProvider = &evictionREST{}
)

func (r *evictionREST) New() runtime.Object { return &policyv1.Eviction{} }

func (r *evictionREST) Destroy() {}

func (r *evictionREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return policyv1.SchemeGroupVersion.WithKind("Eviction")
}

func (r *evictionREST) Create(ctx context.Context, name string, obj runtime.Object, _ rest.ValidateObjectFunc,
	_ *metav1.CreateOptions) (runtime.Object, error) {
	eviction, ok := obj.(*policyv1.Eviction)
	if !ok {
		return nil, errors.NewBadRequest(fmt.Sprintf("not an Eviction: %T", obj))
	}
	if eviction.Name != "" && eviction.Name != name {
		return nil, errors.NewBadRequest(fmt.Sprintf("the Eviction names pod %q, the path pod %q", eviction.Name, name))
	}
	found, err := r.pods.main.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	pod := found.(*corev1.Pod)
	done := &metav1.Status{Status: metav1.StatusSuccess}
	if pod.DeletionTimestamp != nil {
		return done, nil
	}
	if pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodUnknown {
		if err := r.takeFromBudget(ctx, pod); err != nil {
			return nil, err
		}
	}
	options := eviction.DeleteOptions
	if options == nil {
		options = &metav1.DeleteOptions{}
	}
	if _, _, err := r.pods.main.Delete(ctx, name, rest.ValidateAllObjectFunc, options); err != nil {
		return nil, err
	}
	return done, nil
}

// takeFromBudget records the pod's disruption in its budget, or refuses it.
func (r *evictionREST) takeFromBudget(ctx context.Context, pod *corev1.Pod) error {
	listed, err := r.budgets.main.List(ctx, &metainternalversion.ListOptions{})
	if err != nil {
		return err
	}
	var matching []policyv1.PodDisruptionBudget
	for _, pdb := range listed.(*policyv1.PodDisruptionBudgetList).Items {
		selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || selector.Empty() || !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		matching = append(matching, pdb)
	}
	switch {
	case len(matching) == 0:
		return nil
	case len(matching) > 1:
		return errors.NewInternalError(fmt.Errorf("this pod has more than one PodDisruptionBudget, which the eviction subresource does not support"))
	}
	pdb := matching[0]
	refuse := func(cause string) error {
		err := errors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes,
			metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: cause})
		return err
	}
	if pdb.Status.ObservedGeneration < pdb.Generation {
		return refuse(fmt.Sprintf("The disruption budget %s is still being processed by the server.", pdb.Name))
	}
	if pdb.Status.DisruptionsAllowed <= 0 {
		return refuse(fmt.Sprintf("The disruption budget %s needs %d healthy pods and has %d currently",
			pdb.Name, pdb.Status.DesiredHealthy, pdb.Status.CurrentHealthy))
	}
	pdb.Status.DisruptionsAllowed--
	if pdb.Status.DisruptedPods == nil {
		pdb.Status.DisruptedPods = map[string]metav1.Time{}
	}
	pdb.Status.DisruptedPods[pod.Name] = metav1.Time{Time: time.Now()}
	// A budget changed since it was read is a conflict: the client tries again, as with
	// kube-apiserver.
	_, _, err = r.budgets.status.Update(ctx, pdb.Name, rest.DefaultUpdatedObjectInfo(&pdb),
		rest.ValidateAllObjectFunc, rest.ValidateAllObjectUpdateFunc, false, &metav1.UpdateOptions{})
	return err
}
