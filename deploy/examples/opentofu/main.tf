# OpenTofu (or Terraform): gpu-warden beside the GitLab Runner that starts the GPU CI jobs,
# both as helm_release resources, applied from an empty cluster in dependency order:
# namespaces (gpu-warden; gitlab-runner for the runner; gitlab-ci for its job pods), then the
# runner's token Secret and its Role in gitlab-ci, then the two releases.
#
#   tofu init && tofu apply -var kubeconfig=~/.kube/config -var runner_token=glrt-…
#
# Written for the hashicorp/helm provider 3.x (`kubernetes = {…}` and `set = [{…}]` are
# attributes). With helm 2.x write them as blocks instead: `kubernetes { config_path = … }`
# in the provider and one `set { name = … value = … }` block per value.
#
# The gpu-warden chart is pulled from the OCI registry scripts/release.sh pushed it to
# (docs/deploy.md, "Releasing"); its values live in gpu-warden-values.yaml beside this file.
# deploy/check.sh renders them with the chart and deploy/tests/check_examples.py checks this
# file (order, names, every value set exists in the chart), so a mistake fails CI, not `apply`.
# The ServiceMonitor, PrometheusRule and dashboard need kube-prometheus-stack's CRDs.

terraform {
  required_providers {
    helm       = { source = "hashicorp/helm", version = "~> 3.0" }
    kubernetes = { source = "hashicorp/kubernetes", version = "~> 2.36" }
  }
}

variable "kubeconfig" { type = string }
variable "runner_token" {
  type      = string
  sensitive = true
}
variable "gpu_warden_registry" {
  type    = string
  default = "oci://123456789012.dkr.ecr.eu-west-1.amazonaws.com/helm-charts"
}
variable "scheduler_profile" {
  description = "gpu-warden's scheduler profile: GPU jobs placed by free VRAM (docs/scheduling.md)"
  type        = bool
  default     = true
}

locals {
  scheduler_name = "gpu-warden-scheduler"
  runner_toml    = file("${path.module}/../gitlab-runner-config.toml")
  # With the scheduler profile, the job pods name it (GitLab Runner's scheduler_name); without
  # it they must not, or they would stay Pending.
  runner_config = var.scheduler_profile ? replace(local.runner_toml, "[runners.kubernetes]\n",
  "[runners.kubernetes]\n    scheduler_name = \"${local.scheduler_name}\"\n") : local.runner_toml
}

provider "kubernetes" { config_path = var.kubeconfig }
provider "helm" {
  kubernetes = { config_path = var.kubeconfig }
}

# The namespace, with the Pod Security level hostPID needs (Helm's create_namespace sets no labels).
resource "kubernetes_namespace_v1" "gpu_warden" {
  metadata {
    name = "gpu-warden"
    labels = {
      "pod-security.kubernetes.io/enforce" = "privileged"
      "pod-security.kubernetes.io/warn"    = "restricted"
    }
  }
}

# The runner itself.
resource "kubernetes_namespace_v1" "gitlab_runner" {
  metadata { name = "gitlab-runner" }
}

# The GPU CI job pods (gitlab-runner-config.toml: namespace = "gitlab-ci").
resource "kubernetes_namespace_v1" "gitlab_ci" {
  metadata { name = "gitlab-ci" }
}

resource "kubernetes_secret_v1" "runner_token" {
  metadata {
    name      = "gitlab-runner-token"
    namespace = kubernetes_namespace_v1.gitlab_runner.metadata[0].name
  }
  data = {
    "runner-token"              = var.runner_token
    "runner-registration-token" = ""
  }
}

# The gitlab-runner chart's rbac.create grants its ServiceAccount (named after the release:
# gitlab-runner) rights in its own namespace only; the Kubernetes executor starts the jobs in
# gitlab-ci, so it needs them there (GitLab's documented minimum for the executor, plus events
# for print_pod_warning_events: a job log shows why gpu-warden stopped the job).
resource "kubernetes_role_v1" "runner_jobs" {
  metadata {
    name      = "gitlab-runner-jobs"
    namespace = kubernetes_namespace_v1.gitlab_ci.metadata[0].name
  }
  rule {
    api_groups = [""]
    resources  = ["pods"]
    verbs      = ["create", "delete", "get", "list", "watch"]
  }
  rule {
    api_groups = [""]
    resources  = ["pods/attach", "pods/exec"]
    verbs      = ["create", "delete", "get", "patch"]
  }
  rule {
    api_groups = [""]
    resources  = ["pods/log"]
    verbs      = ["get", "list"]
  }
  rule {
    api_groups = [""]
    resources  = ["secrets", "configmaps"]
    verbs      = ["create", "delete", "get", "update"]
  }
  rule {
    api_groups = [""]
    resources  = ["serviceaccounts"]
    verbs      = ["get"]
  }
  rule {
    api_groups = [""]
    resources  = ["services"]
    verbs      = ["create", "get"]
  }
  rule {
    api_groups = [""]
    resources  = ["events"]
    verbs      = ["list", "watch"]
  }
}

resource "kubernetes_role_binding_v1" "runner_jobs" {
  metadata {
    name      = "gitlab-runner-jobs"
    namespace = kubernetes_namespace_v1.gitlab_ci.metadata[0].name
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.runner_jobs.metadata[0].name
  }
  subject {
    kind      = "ServiceAccount"
    name      = "gitlab-runner"
    namespace = kubernetes_namespace_v1.gitlab_runner.metadata[0].name
  }
}

resource "helm_release" "gpu_warden" {
  name       = "gpu-warden"
  namespace  = kubernetes_namespace_v1.gpu_warden.metadata[0].name
  repository = var.gpu_warden_registry
  chart      = "gpu-warden"
  version    = "0.1.0"
  values     = [file("${path.module}/gpu-warden-values.yaml")]
  set = [
    { name = "scheduler.enabled", value = tostring(var.scheduler_profile) },
    { name = "scheduler.schedulerName", value = local.scheduler_name },
  ]
  # The chart's values.schema.json and its checks refuse a wrong value at plan time with its name.
  atomic  = true
  timeout = 300
}

# GitLab Runner, Kubernetes executor: its job pods are what the guard may evict
# (deploy/examples/gitlab-runner-config.toml labels them workload-type=gpu-ci).
resource "helm_release" "gitlab_runner" {
  name       = "gitlab-runner"
  namespace  = kubernetes_namespace_v1.gitlab_runner.metadata[0].name
  repository = "https://charts.gitlab.io"
  chart      = "gitlab-runner"
  version    = "0.71.0"
  values = [yamlencode({
    gitlabUrl = "https://gitlab.example.com/"
    rbac      = { create = true }
    runners = {
      secret = kubernetes_secret_v1.runner_token.metadata[0].name
      config = local.runner_config
    }
  })]
  # gpu-warden first: a GPU job scheduled before the agents (and the scheduler profile it
  # names) exist would wait or run unguarded.
  depends_on = [kubernetes_role_binding_v1.runner_jobs, helm_release.gpu_warden]
}
