# OpenTofu (or Terraform): gpu-warden beside the GitLab Runner that starts the GPU CI jobs,
# both as helm_release resources of the hashicorp/helm provider.
#
#   tofu init && tofu apply -var kubeconfig=~/.kube/config -var runner_token=glrt-…
#
# The gpu-warden chart is pulled from the OCI registry it was pushed to (docs/deploy.md,
# "Publishing the chart"); its values live in gpu-warden-values.yaml beside this file, which
# deploy/check.sh renders with the chart, so a value the chart refuses fails CI, not `apply`.

terraform {
  required_providers {
    helm       = { source = "hashicorp/helm", version = "~> 2.17" }
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

provider "kubernetes" { config_path = var.kubeconfig }
provider "helm" {
  kubernetes { config_path = var.kubeconfig }
}

# The namespace, with the Pod Security level hostPID needs (Helm's create_namespace sets no labels).
resource "kubernetes_namespace" "gpu_warden" {
  metadata {
    name = "gpu-warden"
    labels = {
      "pod-security.kubernetes.io/enforce" = "privileged"
      "pod-security.kubernetes.io/warn"    = "restricted"
    }
  }
}

resource "helm_release" "gpu_warden" {
  name       = "gpu-warden"
  namespace  = kubernetes_namespace.gpu_warden.metadata[0].name
  repository = var.gpu_warden_registry
  chart      = "gpu-warden"
  version    = "0.1.0"
  values     = [file("${path.module}/gpu-warden-values.yaml")]
  # The chart's values.schema.json refuses a wrong value at plan time with its name.
  atomic  = true
  timeout = 300
}

# GitLab Runner, Kubernetes executor: its job pods are what the guard may evict
# (deploy/examples/gitlab-runner-config.toml labels them workload-type=gpu-ci).
resource "helm_release" "gitlab_runner" {
  name             = "gitlab-runner"
  namespace        = "gitlab-runner"
  create_namespace = true
  repository       = "https://charts.gitlab.io"
  chart            = "gitlab-runner"
  version          = "0.71.0"
  values = [yamlencode({
    gitlabUrl = "https://gitlab.example.com/"
    rbac      = { create = true }
    runners = {
      secret = "gitlab-runner-token"
      config = file("${path.module}/../gitlab-runner-config.toml")
    }
  })]
  depends_on = [kubernetes_secret.runner_token, helm_release.gpu_warden]
}

resource "kubernetes_secret" "runner_token" {
  metadata {
    name      = "gitlab-runner-token"
    namespace = "gitlab-runner"
  }
  data = {
    "runner-token"              = var.runner_token
    "runner-registration-token" = ""
  }
}
