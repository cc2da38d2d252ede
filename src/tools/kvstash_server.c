/* kvstash-server: the standalone store process. By default an owner with its segment and an
 * embedded master; --master-only and --owner-only split the two. */
#define _GNU_SOURCE
#include "master/master_server_int.h"
#include "owner/owner_int.h"
#include "ha/etcd_int.h"

#include <pthread.h>

#include <kvstash/kvstash.h>

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvstash-server [--master-only | --owner-only] [options]\n"
            "\n"
            "Runs a kvstash store: by default an owner serving one memory segment together\n"
            "with an embedded metadata master.\n"
            "\n"
            "  --master-only              run only the metadata master\n"
            "  --owner-only               run only an owner; it joins the master of --master\n"
            "  --master HOST:PORT         master an owner joins (default 127.0.0.1:50051), or\n"
            "                             etcd://HOST:PORT[,...] to follow the leader there\n"
            "  --etcd HOST:PORT[,...]     high availability (docs/ha.md): the master is a leader\n"
            "                             candidate on this etcd cluster; the embedded owner\n"
            "                             follows the leader\n"
            "  --etcd-prefix PATH         keys in etcd under this prefix (default /kvstash)\n"
            "  --etcd-ttl-s N             the leader's etcd lease TTL in seconds (default 2):\n"
            "                             a dead leader is replaced after about this long\n"
            "  --advertise HOST:PORT      the master address the leader record gives clients\n"
            "                             (default BIND:PORT; needed with --bind 0.0.0.0)\n"
            "  --recovery-ms N            a new leader lets owners re-register this long before\n"
            "                             serving clients (default 300)\n"
            "  --segment-size SIZE        owner segment size, e.g. 4GiB (default 1GiB)\n"
            "  --segment-name NAME        owner segment name (default NODE:DATAPORT)\n"
            "  --node NAME                this host's name for same-node placement and the\n"
            "                             default segment name (default: the host name)\n"
            "  --data-port N              owner data port (default 0: any free port)\n"
            "  --bind HOST                address to listen on (default 127.0.0.1)\n"
            "  --port N                   master RPC port (default 50051; 0 picks a free one)\n"
            "  --port-file PATH           write the master port (owner-only: the data port)\n"
            "  --lease-ms N               read lease per lookup (default 10000)\n"
            "  --heartbeat-timeout-ms N   drop an owner silent this long (default 10000)\n"
            "  --put-discard-ms N         revoke puts not ended this long (default 30000)\n"
            "  --pause-ms N               a master loop stalled this long was paused: owners\n"
            "                             get a grace period (default 0: from the time-out;\n"
            "                             else above 200)\n"
            "  --probe-timeout-ms N       wait for a connect proving a silent owner dead before\n"
            "                             its name is given to a new one (default 1000)\n"
            "  --max-conns N              master connections open at most; more are refused\n"
            "                             with an error (default 4096)\n"
            "  --handshake-timeout-ms N   close a master connection whose handshake has not\n"
            "                             completed this long after accept (default 5000)\n"
            "  --idle-timeout-ms N        close a master connection with no request this long\n"
            "                             (default 600000; 0: never; owners heartbeat every\n"
            "                             500 ms at most)\n"
            "  --data-max-conns N         owner data connections open at most (default 1024)\n"
            "  --data-handshake-timeout-ms N\n"
            "                             close a data or same-host connection whose\n"
            "                             handshake has not completed this long (default 5000)\n"
            "  --data-idle-timeout-ms N   close a data connection with no request this long\n"
            "                             (default 60000; 0: never)\n"
            "  --auth-token-file PATH     the cluster's shared secret (mode 0600, 16+ bytes):\n"
            "                             every peer must prove it (default: KVS_AUTH_TOKEN_FILE)\n"
            "  --insecure-no-auth         listen on a non-loopback address without a secret\n"
            "                             (any peer that reaches the ports owns the store)\n"
            "  --tls                      TLS 1.3 on the master and data ports, keyed by the\n"
            "                             token (no certificates; default: KVS_TLS=1)\n"
            "  --high-watermark R         segment fill ratio that starts eviction (0.90)\n"
            "  --evict-ratio R            share of a segment freed per eviction (0.05)\n"
            "  --default-soft-pin-ttl-ms N  a soft pin's life when the put names none (1800000)\n"
            "  --max-soft-pin-ttl-ms N    the longest soft pin a put may ask for (86400000)\n"
            "  --allow-evict-soft-pinned B  evict soft-pinned objects after all unpinned ones\n"
            "                             when space is needed: 1 (default) or 0\n"
            "  --metrics-port N           serve Prometheus metrics of the master and the owner\n"
            "                             at http://BIND:N/metrics (default 9003; 0 picks a\n"
            "                             free port; the default port taken is a warning)\n"
            "  --metrics-bind HOST        address the metrics listen on (default: --bind)\n"
            "  --no-metrics               no metrics endpoint\n"
            "  --log-level LEVEL          error|warn|info|debug|trace (default info)\n"
            "  --version                  print the version\n"
            "  -h, --help                 this text\n"
            "\n"
            "Environment: KVS_MASTER_LEASE_MS, KVS_MASTER_HEARTBEAT_TIMEOUT_MS,\n"
            "KVS_MASTER_PUT_DISCARD_MS, KVS_MASTER_HIGH_WATERMARK, KVS_MASTER_EVICT_RATIO,\n"
            "KVS_AUTH_TOKEN_FILE, KVS_TLS, KVS_LOG_LEVEL. Options override the environment.\n");
}

static int parse_ms(const char *opt, const char *v, uint64_t *out)
{
    if (kvs__parse_u64(v, 86400000ull, out) != KVS_OK) {
        fprintf(stderr, "kvstash-server: %s wants milliseconds (0..86400000), got '%s'\n", opt, v);
        return -1;
    }
    return 0;
}

/* A connection count of at least 1. */
static int parse_conns(const char *opt, const char *v, uint32_t *out)
{
    uint64_t n;
    if (kvs__parse_u64(v, 1000000, &n) != KVS_OK || n == 0) {
        fprintf(stderr, "kvstash-server: %s wants a count (1..1000000), got '%s'\n", opt, v);
        return -1;
    }
    *out = (uint32_t)n;
    return 0;
}

/* Milliseconds, at least 1. */
static int parse_ms_nonzero(const char *opt, const char *v, uint64_t *out)
{
    if (parse_ms(opt, v, out))
        return -1;
    if (*out == 0) {
        fprintf(stderr, "kvstash-server: %s wants at least 1\n", opt);
        return -1;
    }
    return 0;
}

static int parse_ratio(const char *opt, const char *v, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (*end != '\0' || !(d > 0.0 && d <= 1.0)) {
        fprintf(stderr, "kvstash-server: %s wants a ratio in (0, 1], got '%s'\n", opt, v);
        return -1;
    }
    *out = d;
    return 0;
}

int main(int argc, char **argv)
{
    enum {
        O_MASTER_ONLY = 256,
        O_BIND,
        O_PORT,
        O_PORT_FILE,
        O_LEASE,
        O_HB,
        O_DISCARD,
        O_HWM,
        O_EVICT,
        O_PIN_TTL,
        O_PIN_MAX,
        O_PIN_EVICT,
        O_LOG,
        O_VERSION,
        O_OWNER_ONLY,
        O_MASTER,
        O_SEG_SIZE,
        O_SEG_NAME,
        O_DATA_PORT,
        O_PAUSE,
        O_PROBE,
        O_MAX_CONNS,
        O_HANDSHAKE,
        O_IDLE,
        O_DATA_MAX_CONNS,
        O_DATA_HANDSHAKE,
        O_DATA_IDLE,
        O_AUTH_FILE,
        O_INSECURE,
        O_TLS,
        O_ETCD,
        O_ETCD_PREFIX,
        O_ETCD_TTL,
        O_ADVERTISE,
        O_RECOVERY,
        O_NODE,
        O_METRICS_PORT,
        O_METRICS_BIND,
        O_NO_METRICS
    };
    static const struct option opts[] = {
        {"master-only", no_argument, NULL, O_MASTER_ONLY},
        {"owner-only", no_argument, NULL, O_OWNER_ONLY},
        {"master", required_argument, NULL, O_MASTER},
        {"segment-size", required_argument, NULL, O_SEG_SIZE},
        {"segment-name", required_argument, NULL, O_SEG_NAME},
        {"data-port", required_argument, NULL, O_DATA_PORT},
        {"bind", required_argument, NULL, O_BIND},
        {"port", required_argument, NULL, O_PORT},
        {"port-file", required_argument, NULL, O_PORT_FILE},
        {"lease-ms", required_argument, NULL, O_LEASE},
        {"heartbeat-timeout-ms", required_argument, NULL, O_HB},
        {"put-discard-ms", required_argument, NULL, O_DISCARD},
        {"pause-ms", required_argument, NULL, O_PAUSE},
        {"probe-timeout-ms", required_argument, NULL, O_PROBE},
        {"max-conns", required_argument, NULL, O_MAX_CONNS},
        {"handshake-timeout-ms", required_argument, NULL, O_HANDSHAKE},
        {"idle-timeout-ms", required_argument, NULL, O_IDLE},
        {"data-max-conns", required_argument, NULL, O_DATA_MAX_CONNS},
        {"data-handshake-timeout-ms", required_argument, NULL, O_DATA_HANDSHAKE},
        {"data-idle-timeout-ms", required_argument, NULL, O_DATA_IDLE},
        {"auth-token-file", required_argument, NULL, O_AUTH_FILE},
        {"insecure-no-auth", no_argument, NULL, O_INSECURE},
        {"tls", no_argument, NULL, O_TLS},
        {"etcd", required_argument, NULL, O_ETCD},
        {"etcd-prefix", required_argument, NULL, O_ETCD_PREFIX},
        {"etcd-ttl-s", required_argument, NULL, O_ETCD_TTL},
        {"advertise", required_argument, NULL, O_ADVERTISE},
        {"recovery-ms", required_argument, NULL, O_RECOVERY},
        {"node", required_argument, NULL, O_NODE},
        {"metrics-port", required_argument, NULL, O_METRICS_PORT},
        {"metrics-bind", required_argument, NULL, O_METRICS_BIND},
        {"no-metrics", no_argument, NULL, O_NO_METRICS},
        {"high-watermark", required_argument, NULL, O_HWM},
        {"evict-ratio", required_argument, NULL, O_EVICT},
        {"default-soft-pin-ttl-ms", required_argument, NULL, O_PIN_TTL},
        {"max-soft-pin-ttl-ms", required_argument, NULL, O_PIN_MAX},
        {"allow-evict-soft-pinned", required_argument, NULL, O_PIN_EVICT},
        {"log-level", required_argument, NULL, O_LOG},
        {"version", no_argument, NULL, O_VERSION},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    if (getenv("KVS_LOG_LEVEL") == NULL)
        kvs__log_set_level(KVS_LOG_INFO);
    kvs__master_server_config_t cfg;
    if (kvs__master_server_config_init(&cfg) != KVS_OK)
        return 2;
    kvs__data_server_config_t dcfg;
    kvs__data_server_config_init(&dcfg);
    bool master_only = false, owner_only = false, insecure = false, tls = false;
    const char *port_file = NULL, *master_addr = NULL, *seg_name = NULL, *auth_file = NULL;
    const char *node = NULL, *metrics_bind = NULL;
    uint64_t seg_size = 1ull << 30, data_port = 0, metrics_port = KVS_DEFAULT_METRICS_PORT;
    bool metrics = true, metrics_port_given = false;
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MASTER_ONLY:
            master_only = true;
            break;
        case O_OWNER_ONLY:
            owner_only = true;
            break;
        case O_MASTER:
            master_addr = optarg;
            break;
        case O_SEG_SIZE:
            if (kvs__parse_size(optarg, &seg_size) != KVS_OK || seg_size < 4096) {
                fprintf(stderr,
                        "kvstash-server: --segment-size wants a size of at least 4KiB "
                        "(e.g. 4GiB), got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_SEG_NAME:
            seg_name = optarg;
            break;
        case O_DATA_PORT:
            if (kvs__parse_u64(optarg, 65535, &data_port) != KVS_OK) {
                fprintf(stderr, "kvstash-server: --data-port wants 0..65535, got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_BIND:
            cfg.bind_host = optarg;
            break;
        case O_PORT:
            if (kvs__parse_u64(optarg, 65535, &v) != KVS_OK) {
                fprintf(stderr, "kvstash-server: --port wants 0..65535, got '%s'\n", optarg);
                return 2;
            }
            cfg.port = (uint16_t)v;
            break;
        case O_PORT_FILE:
            port_file = optarg;
            break;
        case O_LEASE:
            if (parse_ms("--lease-ms", optarg, &cfg.master.lease_ms))
                return 2;
            break;
        case O_HB:
            if (parse_ms("--heartbeat-timeout-ms", optarg, &cfg.master.heartbeat_timeout_ms))
                return 2;
            break;
        case O_DISCARD:
            if (parse_ms("--put-discard-ms", optarg, &cfg.master.put_discard_ms))
                return 2;
            break;
        case O_PAUSE:
            if (parse_ms("--pause-ms", optarg, &cfg.pause_ms))
                return 2;
            if (cfg.pause_ms != 0 && cfg.pause_ms <= 2 * cfg.tick_ms) {
                /* An idle loop wakes once a tick: a shorter "pause" would be every wake-up. */
                fprintf(stderr, "kvstash-server: --pause-ms must be 0 or above %llu (two ticks)\n",
                        (unsigned long long)(2 * cfg.tick_ms));
                return 2;
            }
            break;
        case O_PROBE:
            if (parse_ms("--probe-timeout-ms", optarg, &cfg.probe_ms) || cfg.probe_ms == 0) {
                if (cfg.probe_ms == 0)
                    fprintf(stderr, "kvstash-server: --probe-timeout-ms wants at least 1\n");
                return 2;
            }
            break;
        case O_MAX_CONNS:
            if (parse_conns("--max-conns", optarg, &cfg.max_conns))
                return 2;
            break;
        case O_HANDSHAKE:
            if (parse_ms_nonzero("--handshake-timeout-ms", optarg, &cfg.handshake_timeout_ms))
                return 2;
            break;
        case O_IDLE:
            if (parse_ms("--idle-timeout-ms", optarg, &cfg.idle_timeout_ms))
                return 2;
            break;
        case O_DATA_MAX_CONNS:
            if (parse_conns("--data-max-conns", optarg, &dcfg.max_conns))
                return 2;
            break;
        case O_DATA_HANDSHAKE:
            if (parse_ms_nonzero("--data-handshake-timeout-ms", optarg, &dcfg.handshake_timeout_ms))
                return 2;
            break;
        case O_DATA_IDLE:
            if (parse_ms("--data-idle-timeout-ms", optarg, &dcfg.idle_timeout_ms))
                return 2;
            break;
        case O_AUTH_FILE:
            auth_file = optarg;
            break;
        case O_INSECURE:
            insecure = true;
            break;
        case O_TLS:
            tls = true;
            break;
        case O_ETCD:
            cfg.etcd = kvs__is_etcd_addr(optarg) ? optarg + 7 : optarg;
            break;
        case O_ETCD_PREFIX:
            if (optarg[0] != '/' || strlen(optarg) > KVS_MAX_NAME_LEN) {
                fprintf(stderr, "kvstash-server: --etcd-prefix wants a path starting with '/', "
                                "at most 256 bytes\n");
                return 2;
            }
            cfg.etcd_prefix = optarg;
            break;
        case O_ETCD_TTL:
            if (kvs__parse_u64(optarg, 3600, &cfg.etcd_ttl_s) != KVS_OK || cfg.etcd_ttl_s == 0) {
                fprintf(stderr, "kvstash-server: --etcd-ttl-s wants seconds (1..3600), got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_ADVERTISE: {
            char *h = NULL;
            uint16_t p = 0;
            if (kvs__parse_host_port(optarg, NULL, &h, &p) != KVS_OK || h == NULL || p == 0 ||
                strlen(optarg) > KVS_MAX_NAME_LEN) {
                kvs__free(h);
                fprintf(stderr, "kvstash-server: --advertise wants HOST:PORT, got '%s'\n", optarg);
                return 2;
            }
            kvs__free(h);
            cfg.advertise = optarg;
            break;
        }
        case O_NODE:
            if (*optarg == '\0' || strlen(optarg) > KVS_MAX_NAME_LEN) {
                fprintf(stderr, "kvstash-server: --node wants a name of 1..256 bytes\n");
                return 2;
            }
            node = optarg;
            break;
        case O_METRICS_PORT:
            if (kvs__parse_u64(optarg, 65535, &metrics_port) != KVS_OK) {
                fprintf(stderr,
                        "kvstash-server: --metrics-port wants a port (0..65535), got '%s'\n",
                        optarg);
                return 2;
            }
            metrics_port_given = true;
            break;
        case O_METRICS_BIND:
            metrics_bind = optarg;
            break;
        case O_NO_METRICS:
            metrics = false;
            break;
        case O_RECOVERY:
            if (parse_ms("--recovery-ms", optarg, &cfg.recovery_ms))
                return 2;
            break;
        case O_PIN_TTL:
            if (parse_ms("--default-soft-pin-ttl-ms", optarg, &cfg.master.default_soft_pin_ttl_ms))
                return 2;
            break;
        case O_PIN_MAX:
            if (parse_ms("--max-soft-pin-ttl-ms", optarg, &cfg.master.max_soft_pin_ttl_ms))
                return 2;
            break;
        case O_PIN_EVICT:
            if (strcmp(optarg, "1") != 0 && strcmp(optarg, "0") != 0) {
                fprintf(stderr,
                        "kvstash-server: --allow-evict-soft-pinned wants 1 or 0, got '%s'\n",
                        optarg);
                return 2;
            }
            cfg.master.allow_evict_soft_pinned = optarg[0] == '1';
            break;
        case O_HWM:
            if (parse_ratio("--high-watermark", optarg, &cfg.master.high_watermark))
                return 2;
            break;
        case O_EVICT:
            if (parse_ratio("--evict-ratio", optarg, &cfg.master.evict_ratio))
                return 2;
            break;
        case O_LOG: {
            static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
            size_t i = 0;
            while (i < KVS_ARRAY_SIZE(names) && strcmp(optarg, names[i]) != 0)
                i++;
            if (i == KVS_ARRAY_SIZE(names)) {
                fprintf(stderr, "kvstash-server: unknown log level '%s'\n", optarg);
                return 2;
            }
            kvs__log_set_level((kvs_log_level_t)i);
            break;
        }
        case O_VERSION: {
#ifdef KVS_TEST_HOOKS
            const char *hooks = "yes";
#else
            const char *hooks = "no";
#endif
            printf("kvstash-server %s\nfeatures: etcd %s, metrics %s, test-hooks %s\n",
                   KVS_VERSION_STRING, kvs__etcd_supported() ? "yes" : "no",
                   kvs__metrics_http_available() ? "yes" : "no", hooks);
            return 0;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvstash-server: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (master_only && owner_only) {
        fprintf(stderr, "kvstash-server: --master-only and --owner-only exclude each other\n");
        return 2;
    }
    if (master_addr != NULL && !owner_only) {
        fprintf(stderr, "kvstash-server: --master only applies with --owner-only\n");
        return 2;
    }
    if (cfg.etcd != NULL && owner_only) {
        fprintf(stderr, "kvstash-server: an owner follows etcd with --master etcd://HOST:PORT; "
                        "--etcd makes a master candidate\n");
        return 2;
    }
    const char *owner_etcd = cfg.etcd, *owner_prefix = cfg.etcd_prefix;
    char *etcd_eps = NULL, *etcd_pre = NULL;
    if (owner_only && master_addr != NULL && kvs__is_etcd_addr(master_addr)) {
        if (kvs__etcd_addr_parse(master_addr, &etcd_eps, &etcd_pre) != KVS_OK) {
            fprintf(stderr,
                    "kvstash-server: --master wants etcd://HOST:PORT[,...][/PREFIX], "
                    "got '%s'\n",
                    master_addr);
            return 2;
        }
        owner_etcd = etcd_eps;
        if (owner_prefix == NULL)
            owner_prefix = etcd_pre;
    }
    if ((cfg.etcd != NULL || owner_etcd != NULL) && !kvs__etcd_supported()) {
        fprintf(stderr, "kvstash-server: --etcd and etcd:// need a build with etcd support "
                        "(libcurl and json-c; Debian: libcurl4-openssl-dev libjson-c-dev)\n");
        return 2;
    }
    if (metrics && metrics_port_given && !kvs__metrics_http_available()) {
        fprintf(stderr, "kvstash-server: --metrics-port needs a build with libmicrohttpd "
                        "(Debian: libmicrohttpd-dev); --no-metrics runs without it\n");
        return 2;
    }
    if (auth_file != NULL && *auth_file == '\0') {
        fprintf(stderr, "kvstash-server: --auth-token-file wants a path\n");
        return 2;
    }
    char why[512];
    if (kvs__auth_configure(auth_file, &cfg.auth, why, sizeof(why)) != KVS_OK) {
        fprintf(stderr, "kvstash-server: %s\n", why);
        return 2;
    }
    if (!tls && kvs__env_bool("KVS_TLS", &tls) != KVS_OK) {
        fprintf(stderr, "kvstash-server: KVS_TLS must be 0 or 1\n");
        return 2;
    }
    if (tls && !cfg.auth.on) {
        fprintf(stderr, "kvstash-server: --tls needs --auth-token-file (or KVS_AUTH_TOKEN_FILE): "
                        "the TLS key is derived from the token\n");
        return 2;
    }
    cfg.tls = tls;
    if (cfg.auth.on && insecure) {
        fprintf(stderr, "kvstash-server: --insecure-no-auth and a token exclude each other\n");
        return 2;
    }
    if (!cfg.auth.on && !kvs__host_is_loopback(cfg.bind_host)) {
        if (!insecure) {
            fprintf(stderr,
                    "kvstash-server: refusing to listen on %s without authentication: give "
                    "--auth-token-file PATH (or KVS_AUTH_TOKEN_FILE), or --insecure-no-auth to "
                    "let any peer that reaches it read, write and remove everything\n",
                    cfg.bind_host);
            return 2;
        }
        fprintf(stderr,
                "kvstash-server: WARNING: --insecure-no-auth: any peer that reaches %s can "
                "read, write, remove and unmount everything\n",
                cfg.bind_host);
    }
    /* Signals are taken synchronously by the main thread; every other thread blocks them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    kvs__master_server_t *master = NULL;
    kvs__owner_t *owner = NULL;
    kvs__metrics_http_t *http = NULL;
    int rc = KVS_OK, exit_code = 1;
    uint16_t shown_port = 0;
    if (!owner_only) {
        rc = kvs__master_server_create(&cfg, &master);
        if (rc != KVS_OK) {
            fprintf(stderr, "kvstash-server: cannot start the master on %s:%u: %s\n", cfg.bind_host,
                    (unsigned)cfg.port, kvs_status_str(rc));
            goto out;
        }
        rc = kvs__master_server_start(master);
        if (rc != KVS_OK)
            goto out;
        shown_port = kvs__master_server_port(master);
        fprintf(stderr, "kvstash-server %s: master listening on %s:%u\n", KVS_VERSION_STRING,
                cfg.bind_host, (unsigned)shown_port);
    }
    if (!master_only) {
        kvs__owner_config_t oc = {.segment_size = seg_size,
                                  .segment_name = seg_name,
                                  .node = node,
                                  .rpc_timeout_ms = 5000,
                                  .data = dcfg};
        oc.data.auth = cfg.auth;
        oc.data.tls = cfg.tls;
        oc.data.bind_host = cfg.bind_host;
        oc.data.port = (uint16_t)data_port;
        char *host = NULL;
        uint16_t mport = 0;
        oc.etcd = owner_etcd;
        oc.etcd_prefix = owner_prefix;
        if (owner_etcd != NULL) {
            host = kvs__strdup(""); /* the leader, from etcd */
        } else if (owner_only) {
            if (kvs__parse_host_port(master_addr ? master_addr : "127.0.0.1:50051", "127.0.0.1",
                                     &host, &mport) != KVS_OK ||
                mport == 0) {
                fprintf(stderr, "kvstash-server: --master wants HOST:PORT, got '%s'\n",
                        master_addr);
                exit_code = 2;
                goto out;
            }
        } else {
            /* The embedded master, where it listens (loopback when it listens everywhere). */
            const char *b = cfg.bind_host;
            bool wild = b == NULL || !strcmp(b, "0.0.0.0") || !strcmp(b, "::") || !*b;
            host = kvs__strdup(wild ? (b && !strcmp(b, "::") ? "::1" : "127.0.0.1") : b);
            mport = shown_port;
        }
        oc.master_host = host;
        oc.master_port = mport;
        rc = kvs__owner_create(&oc, &owner);
        if (rc != KVS_OK) {
            fprintf(stderr,
                    "kvstash-server: cannot start the owner (segment %llu bytes, "
                    "master %s:%u): %s\n",
                    (unsigned long long)seg_size, host, (unsigned)mport, kvs_status_str(rc));
            kvs__free(host);
            goto out;
        }
        kvs__free(host);
        char sz[32];
        fprintf(stderr, "kvstash-server: owner serving a %s segment on data port %u\n",
                kvs__format_size(seg_size, sz, sizeof(sz)), (unsigned)kvs__owner_data_port(owner));
        if (owner_only)
            shown_port = kvs__owner_data_port(owner);
    }
    if (metrics && kvs__metrics_http_available()) {
        const char *mb = metrics_bind ? metrics_bind : cfg.bind_host;
        rc = kvs__metrics_http_start(mb, (uint16_t)metrics_port, &http);
        if (rc != KVS_OK && metrics_port_given) {
            fprintf(stderr, "kvstash-server: %s\n", kvs_last_error());
            exit_code = 2;
            goto out;
        }
        if (rc != KVS_OK) {
            fprintf(stderr, "kvstash-server: WARNING: no metrics endpoint: %s\n", kvs_last_error());
        } else {
            if (master != NULL)
                kvs__metrics_http_add(http, kvs__master_server_metrics_render, master);
            if (owner != NULL)
                kvs__metrics_http_add(http, kvs__data_server_metrics_render,
                                      kvs__owner_data_server(owner));
            fprintf(stderr, "kvstash-server: metrics on http://%s:%u/metrics\n",
                    mb ? mb : "0.0.0.0", (unsigned)kvs__metrics_http_port(http));
        }
    }
    if (port_file != NULL) {
        /* Written to a temporary name and renamed, so a reader never sees a partial file. */
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%u\n", (unsigned)shown_port) < 0 || fclose(f) != 0 ||
            rename(tmp, port_file) != 0) {
            fprintf(stderr, "kvstash-server: cannot write %s\n", port_file);
            goto out;
        }
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    exit_code = 0;
out:
    kvs__metrics_http_stop(http); /* before what it renders */
    kvs__owner_destroy(owner);
    kvs__master_server_destroy(master);
    kvs__free(etcd_eps);
    kvs__free(etcd_pre);
    fprintf(stderr, "kvstash-server: stopped\n");
    return exit_code;
}
