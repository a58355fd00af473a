# moat.nomad.hcl: moat's control plane as one Nomad service job: the
# gateway, moat-sessiond and moat-snapd, one group each. The nodes
# (moat-vmd, one per KVM host) are the system job in moat-vmd.nomad.hcl:
# a Nomad job file holds one job.
#   nomad job run deploy/nomad/moat.nomad.hcl
#   nomad job run deploy/nomad/moat-vmd.nomad.hcl
# Needs: the moat-control package on the clients that run it (the exec
# driver runs /usr/bin/moat-*), Nomad's native service discovery (1.3
# or later), host volumes moat-gateway, moat-sessiond and moat-snapd in
# those clients' configuration (state that must outlive an allocation),
# and the certificates of deploy/moat-pki as Nomad Variables, one per
# group (deploy/README.md shows `nomad var put`):
#   nomad/jobs/moat/gateway   cert, key, ca, peer_ca, survey_ca
#   nomad/jobs/moat/sessiond  cert, key, ca, peer_ca
#   nomad/jobs/moat/snapd     cert, key, ca, peer_ca
# Ports: gateway 7700 (clients), 7701 (survey), sessiond 7720, snapd
# 7730, all tls+tcp. One gateway: active-active gateways are a later
# issue.

job "moat" {
  type        = "service"
  datacenters = ["*"]

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "sessiond" {
    count = 1

    network {
      port "rpc" {
        static = 7720
      }
    }

    service {
      name     = "moat-sessiond"
      port     = "rpc"
      provider = "nomad"
    }

    volume "state" {
      type      = "host"
      source    = "moat-sessiond"
      read_only = false
    }

    task "sessiond" {
      driver = "exec"

      config {
        command = "/usr/bin/moat-sessiond"
        args    = ["--config", "${NOMAD_TASK_DIR}/moat.conf"]
      }

      volume_mount {
        volume      = "state"
        destination = "/var/lib/moat"
      }

      template {
        destination = "${NOMAD_TASK_DIR}/moat.conf"
        data        = <<-EOT
          [sessiond]
          state-dir = /var/lib/moat
          listen = tls+tcp://0.0.0.0:7720
          tls-cert = {{ env "NOMAD_SECRETS_DIR" }}/cert.pem
          tls-key = {{ env "NOMAD_SECRETS_DIR" }}/key.pem
          tls-ca = {{ env "NOMAD_SECRETS_DIR" }}/ca.pem
          tls-peer-ca = {{ env "NOMAD_SECRETS_DIR" }}/peer-ca.pem
        EOT
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/cert.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/sessiond\" }}{{ .cert }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/key.pem"
        perms       = "0600"
        data        = "{{ with nomadVar \"nomad/jobs/moat/sessiond\" }}{{ .key }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/sessiond\" }}{{ .ca }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/peer-ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/sessiond\" }}{{ .peer_ca }}{{ end }}"
      }

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }

  group "snapd" {
    count = 1

    network {
      port "rpc" {
        static = 7730
      }
    }

    service {
      name     = "moat-snapd"
      port     = "rpc"
      provider = "nomad"
    }

    volume "state" {
      type      = "host"
      source    = "moat-snapd"
      read_only = false
    }

    task "snapd" {
      driver = "exec"

      config {
        command = "/usr/bin/moat-snapd"
        args    = ["--config", "${NOMAD_TASK_DIR}/moat.conf"]
      }

      volume_mount {
        volume      = "state"
        destination = "/var/lib/moat"
      }

      template {
        destination = "${NOMAD_TASK_DIR}/moat.conf"
        data        = <<-EOT
          [snapd]
          state-dir = /var/lib/moat
          listen = tls+tcp://0.0.0.0:7730
          tls-cert = {{ env "NOMAD_SECRETS_DIR" }}/cert.pem
          tls-key = {{ env "NOMAD_SECRETS_DIR" }}/key.pem
          tls-ca = {{ env "NOMAD_SECRETS_DIR" }}/ca.pem
          tls-peer-ca = {{ env "NOMAD_SECRETS_DIR" }}/peer-ca.pem
        EOT
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/cert.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/snapd\" }}{{ .cert }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/key.pem"
        perms       = "0600"
        data        = "{{ with nomadVar \"nomad/jobs/moat/snapd\" }}{{ .key }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/snapd\" }}{{ .ca }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/peer-ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/snapd\" }}{{ .peer_ca }}{{ end }}"
      }

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }

  group "gateway" {
    # Active-active gateways are a later issue: one until then.
    count = 1

    network {
      port "rpc" {
        static = 7700
      }
      port "survey" {
        static = 7701
      }
    }

    service {
      name     = "moat-gateway"
      port     = "rpc"
      provider = "nomad"
    }
    service {
      name     = "moat-gateway-survey"
      port     = "survey"
      provider = "nomad"
    }

    volume "state" {
      type      = "host"
      source    = "moat-gateway"
      read_only = false
    }

    task "gateway" {
      driver = "exec"

      config {
        command = "/usr/bin/moat-gateway"
        args    = ["--config", "${NOMAD_TASK_DIR}/moat.conf"]
      }

      volume_mount {
        volume      = "state"
        destination = "/var/lib/moat"
      }

      # sessiond and snapd found by Nomad's service discovery; the
      # gateway checks their certificates name "sessiond" / "snapd".
      template {
        destination = "${NOMAD_TASK_DIR}/moat.conf"
        change_mode = "restart"
        data        = <<-EOT
          [gateway]
          state-dir = /var/lib/moat
          listen = tls+tcp://0.0.0.0:7700
          survey = tls+tcp://0.0.0.0:7701
          {{ range nomadService "moat-sessiond" }}sessiond = tls+tcp://{{ .Address }}:{{ .Port }}
          {{ end }}{{ range nomadService "moat-snapd" }}snapd = tls+tcp://{{ .Address }}:{{ .Port }}
          {{ end }}http = off
          tls-cert = {{ env "NOMAD_SECRETS_DIR" }}/cert.pem
          tls-key = {{ env "NOMAD_SECRETS_DIR" }}/key.pem
          tls-ca = {{ env "NOMAD_SECRETS_DIR" }}/ca.pem
          tls-peer-ca = {{ env "NOMAD_SECRETS_DIR" }}/peer-ca.pem
          survey-tls-peer-ca = {{ env "NOMAD_SECRETS_DIR" }}/survey-ca.pem
        EOT
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/cert.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/gateway\" }}{{ .cert }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/key.pem"
        perms       = "0600"
        data        = "{{ with nomadVar \"nomad/jobs/moat/gateway\" }}{{ .key }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/gateway\" }}{{ .ca }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/peer-ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/gateway\" }}{{ .peer_ca }}{{ end }}"
      }
      template {
        destination = "${NOMAD_SECRETS_DIR}/survey-ca.pem"
        data        = "{{ with nomadVar \"nomad/jobs/moat/gateway\" }}{{ .survey_ca }}{{ end }}"
      }

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }
}
