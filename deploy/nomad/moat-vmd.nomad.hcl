# moat-vmd.nomad.hcl: the moat nodes, a Nomad system job: one moat-vmd on
# every client that says it has KVM, in its client configuration:
#   client { meta { moat_kvm = "true" } }
# (and the moat-node package installed, images built with
# moat-image-build). The control plane is moat.nomad.hcl.
# vmd runs with raw_exec (enable it in the client's plugin config):
# QEMU needs /dev/kvm and the host's /dev/shm, Firecracker's jailer
# needs root, mounts and namespaces, which exec's isolation denies.
# Node id: the Nomad client's name. Its certificate stays on its host,
# like the node's other state: copy the files of `moat-pki issue DIR vmd
# <name>` (cert.pem, key.pem, ca.pem, peer-ca.pem, snapshot.key) to
# /etc/moat/tls there
# (raw_exec reads the host's files), so no node holds another's key.

job "moat-vmd" {
  type        = "system"
  datacenters = ["*"]

  constraint {
    attribute = "${meta.moat_kvm}"
    value     = "true"
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "vmd" {
    network {
      port "rpc" {
        static = 7710
      }
    }

    task "vmd" {
      driver = "raw_exec"
      # vmd destroys its sandboxes on SIGTERM before it exits.
      kill_timeout = "60s"

      config {
        command = "/usr/bin/moat-vmd"
        args    = ["--config", "${NOMAD_TASK_DIR}/moat.conf"]
      }

      env {
        MOAT_VMD_NODE_ID       = "${node.unique.name}"
        MOAT_VMD_ADVERTISE_URL = "tls+tcp://${NOMAD_ADDR_rpc}"
      }

      # The gateway's survey and snapd, by Nomad's service discovery.
      template {
        destination = "${NOMAD_TASK_DIR}/moat.conf"
        change_mode = "restart"
        data        = <<-EOT
          [vmd]
          state-dir = /var/lib/moat
          listen = tls+tcp://0.0.0.0:7710
          {{ range nomadService "moat-gateway-survey" }}survey = tls+tcp://{{ .Address }}:{{ .Port }}
          {{ end }}{{ range nomadService "moat-snapd" }}snapd = tls+tcp://{{ .Address }}:{{ .Port }}
          {{ end }}tls-cert = /etc/moat/tls/cert.pem
          tls-key = /etc/moat/tls/key.pem
          tls-ca = /etc/moat/tls/ca.pem
          tls-peer-ca = /etc/moat/tls/peer-ca.pem
          snapshot-key-file = /etc/moat/tls/snapshot.key
        EOT
      }

      resources {
        cpu    = 1000
        memory = 512
      }
    }
  }
}
