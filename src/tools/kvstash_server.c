/* kvstash-server: the standalone store process. Today it runs the metadata master
 * (--master-only); owner segments join it with the owner module. */
#define _GNU_SOURCE
#include "master/master_server_int.h"

#include <kvstash/kvstash.h>

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvs__master_server_t *g_server;

static void on_signal(int sig)
{
    KVS_UNUSED(sig);
    kvs__master_server_stop(g_server);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvstash-server --master-only [options]\n"
            "\n"
            "Runs the kvstash metadata master.\n"
            "\n"
            "  --master-only              run only the metadata master (required for now)\n"
            "  --bind HOST                address to listen on (default 127.0.0.1)\n"
            "  --port N                   master RPC port (default 50051; 0 picks a free one)\n"
            "  --port-file PATH           write the bound port to PATH once listening\n"
            "  --lease-ms N               read lease per lookup (default 10000)\n"
            "  --heartbeat-timeout-ms N   drop an owner silent this long (default 10000)\n"
            "  --put-discard-ms N         revoke puts not ended this long (default 30000)\n"
            "  --high-watermark R         segment fill ratio that starts eviction (0.90)\n"
            "  --evict-ratio R            share of a segment freed per eviction (0.05)\n"
            "  --log-level LEVEL          error|warn|info|debug|trace (default info)\n"
            "  --version                  print the version\n"
            "  -h, --help                 this text\n"
            "\n"
            "Environment: KVS_MASTER_LEASE_MS, KVS_MASTER_HEARTBEAT_TIMEOUT_MS,\n"
            "KVS_MASTER_PUT_DISCARD_MS, KVS_MASTER_HIGH_WATERMARK, KVS_MASTER_EVICT_RATIO,\n"
            "KVS_LOG_LEVEL. Options override the environment.\n");
}

static int parse_ms(const char *opt, const char *v, uint64_t *out)
{
    if (kvs__parse_u64(v, 86400000ull, out) != KVS_OK) {
        fprintf(stderr, "kvstash-server: %s wants milliseconds (0..86400000), got '%s'\n", opt,
                v);
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
    enum { O_MASTER_ONLY = 256, O_BIND, O_PORT, O_PORT_FILE, O_LEASE, O_HB, O_DISCARD, O_HWM,
           O_EVICT, O_LOG, O_VERSION };
    static const struct option opts[] = {
        {"master-only", no_argument, NULL, O_MASTER_ONLY},
        {"bind", required_argument, NULL, O_BIND},
        {"port", required_argument, NULL, O_PORT},
        {"port-file", required_argument, NULL, O_PORT_FILE},
        {"lease-ms", required_argument, NULL, O_LEASE},
        {"heartbeat-timeout-ms", required_argument, NULL, O_HB},
        {"put-discard-ms", required_argument, NULL, O_DISCARD},
        {"high-watermark", required_argument, NULL, O_HWM},
        {"evict-ratio", required_argument, NULL, O_EVICT},
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
    bool master_only = false;
    const char *port_file = NULL;
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MASTER_ONLY:
            master_only = true;
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
        case O_VERSION:
            printf("kvstash-server %s\n", KVS_VERSION_STRING);
            return 0;
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
    if (!master_only) {
        fprintf(stderr, "kvstash-server: this build serves the metadata master only; start it "
                        "with --master-only (owner segments are not part of this build yet)\n");
        return 2;
    }
    if (cfg.master.heartbeat_timeout_ms == 0 || cfg.master.put_discard_ms == 0) {
        fprintf(stderr, "kvstash-server: time-outs must be positive\n");
        return 2;
    }
    int rc = kvs__master_server_create(&cfg, &g_server);
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstash-server: cannot start the master on %s:%u: %s\n",
                cfg.bind_host, (unsigned)cfg.port, kvs_status_str(rc));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    uint16_t port = kvs__master_server_port(g_server);
    if (port_file != NULL) {
        /* Written to a temporary name and renamed, so a reader never sees a partial file. */
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%u\n", (unsigned)port) < 0 || fclose(f) != 0 ||
            rename(tmp, port_file) != 0) {
            fprintf(stderr, "kvstash-server: cannot write %s\n", port_file);
            kvs__master_server_destroy(g_server);
            return 1;
        }
    }
    fprintf(stderr, "kvstash-server %s: master listening on %s:%u\n", KVS_VERSION_STRING,
            cfg.bind_host, (unsigned)port);
    rc = kvs__master_server_run(g_server);
    kvs__master_server_destroy(g_server);
    fprintf(stderr, "kvstash-server: stopped\n");
    return rc == KVS_OK ? 0 : 1;
}
