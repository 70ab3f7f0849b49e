/* gdtrace: graphdiag's CUDA injection library (graphdiag trace -- CMD).

   The CUDA driver loads it into any process started with CUDA_INJECTION64_PATH naming it and calls
   InitializeInjection once, inside cuInit. It subscribes to CUPTI callbacks on the runtime and driver API
   calls of CUDA graphs (stream capture begin/end, instantiate, exec update, graph launch, exec destroy) and
   of stream / device / context synchronisation, and writes one JSON line per call to the file named by
   GRAPHDIAG_TRACE_OUT (whole lines, O_APPEND, flushed as it goes: see "output"). It records,
   never analyses: graphdiag/trace/convert.py turns the lines into a graphdiag record.

   CUPTI and libcuda are resolved with dlopen/dlsym (libcupti from GRAPHDIAG_CUPTI_PATH), so it compiles from
   the headers alone and links nothing but -ldl -lpthread. A driver callback nested inside a runtime call of
   the same thread is skipped (the runtime call is the one recorded). If CUPTI is missing or already has a
   subscriber, one "error" line is written and nothing else happens.

   Loaded also through LD_PRELOAD (graphdiag trace sets both), it interposes llama.cpp's `llama_decode` in a
   program linked against libllama (llama-server, llama-cli, llama-bench): each call's batch (tokens, positions,
   sequence ids, output rows) is written as a "batch" line and the call goes on to the real function (found with
   dlsym(RTLD_NEXT)). llama_batch's layout is llama.h's since 2024 (n_tokens, token, embd, pos, n_seq_id, seq_id,
   logits). llama.cpp's extended batch (llama_batch_ext, decoded by llama_process: llama-server and llama-bench
   since 2026) is opaque, so its builder calls are interposed and mirrored (see llama_process below). A program
   that reaches these functions through dlsym on libllama's own handle (ctypes: llama-cpp-python) is not
   interposed, and its batches are not seen.

   Synchronisations are written only where graphdiag's in-flight check reads them (see sync_clears). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cupti.h>              /* with generated_cuda_runtime_api_meta.h and generated_cuda_meta.h */

#define EXPORT __attribute__((visibility("default")))
#define GD_NONE INT64_MIN
#define STR(x) #x
#define XSTR(x) STR(x)

/* ---- one record, and its JSON encoding (exported for the CPU tests) ---------------------------------- */
typedef struct gd_rec {
    const char *ev, *fn, *api, *text;
    int64_t pid, tid, device, stream, graph, exec, t0_ns, t1_ns, ret;
    int64_t nodes, kernel_nodes, update_result, error_node, error_node_index, error_node_kernel_index;
    int64_t mem_free_before, mem_free_after;
    const char *error_node_kernel, *error_from_kernel;
    const char *const *kernel_names;
    int64_t n_kernel_names; /* < 0: no kernel_names field */
} gd_rec;

typedef struct { char *buf; size_t cap, len; } sb;

static void put(sb *s, const char *p, size_t n) {
    if (s->len < s->cap) memcpy(s->buf + s->len, p, s->len + n <= s->cap ? n : s->cap - s->len);
    s->len += n;
}
static void puts_(sb *s, const char *p) { put(s, p, strlen(p)); }

static void put_str(sb *s, const char *p) { /* a JSON string: quote, backslash and control characters escaped */
    static const char hex[] = "0123456789abcdef";
    put(s, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)p; *c; c++) {
        char e[7] = {'\\', 0};
        if (*c == '"' || *c == '\\') { e[1] = (char)*c; put(s, e, 2); }
        else if (*c == '\n') put(s, "\\n", 2);
        else if (*c == '\t') put(s, "\\t", 2);
        else if (*c == '\r') put(s, "\\r", 2);
        else if (*c < 0x20 || *c == 0x7f) {
            memcpy(e, "\\u00", 4); e[4] = hex[*c >> 4]; e[5] = hex[*c & 15]; put(s, e, 6);
        } else put(s, (const char *)c, 1);
    }
    put(s, "\"", 1);
}

static void key(sb *s, const char *k) { put(s, ",\"", 2); puts_(s, k); put(s, "\":", 2); }

static void put_int(sb *s, const char *k, int64_t v) {
    char num[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (v == GD_NONE) return;
    do { num[sizeof num - 1 - n++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) num[sizeof num - 1 - n++] = '-';
    key(s, k);
    put(s, num + sizeof num - n, (size_t)n);
}

static void put_text(sb *s, const char *k, const char *v) {
    if (!v) return;
    key(s, k);
    put_str(s, v);
}

/* The record as one JSON line (with '\n') into buf[cap]; returns the length it needs (without the NUL, which
   is written when it fits): call again with a larger buffer when the result is >= cap. */
EXPORT size_t gdtrace_encode(const gd_rec *r, char *buf, size_t cap) {
    sb s = {buf, cap, 0};
    put(&s, "{\"ev\":", 6);
    put_str(&s, r->ev ? r->ev : "api");
    put_text(&s, "fn", r->fn);
    put_text(&s, "api", r->api);
    put_int(&s, "pid", r->pid); put_int(&s, "tid", r->tid); put_int(&s, "device", r->device);
    put_int(&s, "stream", r->stream); put_int(&s, "t0_ns", r->t0_ns); put_int(&s, "t1_ns", r->t1_ns);
    put_int(&s, "ret", r->ret); put_int(&s, "graph", r->graph); put_int(&s, "exec", r->exec);
    put_int(&s, "nodes", r->nodes); put_int(&s, "kernel_nodes", r->kernel_nodes);
    put_int(&s, "update_result", r->update_result);
    if (r->error_node != GD_NONE) { key(&s, "error_node"); puts_(&s, r->error_node ? "true" : "false"); }
    put_int(&s, "error_node_index", r->error_node_index);
    put_int(&s, "error_node_kernel_index", r->error_node_kernel_index);
    put_text(&s, "error_node_kernel", r->error_node_kernel);
    put_text(&s, "error_from_kernel", r->error_from_kernel);
    put_int(&s, "mem_free_before", r->mem_free_before); put_int(&s, "mem_free_after", r->mem_free_after);
    if (r->n_kernel_names >= 0) {
        key(&s, "kernel_names");
        put(&s, "[", 1);
        for (int64_t i = 0; i < r->n_kernel_names; i++) {
            if (i) put(&s, ",", 1);
            put_str(&s, r->kernel_names[i] ? r->kernel_names[i] : "?");
        }
        put(&s, "]", 1);
    }
    put_text(&s, "text", r->text);
    put(&s, "}\n", 2);
    if (s.len < cap) buf[s.len] = 0;
    return s.len;
}

/* ---- llama_decode's batch --------------------------------------------------------------------------- */
typedef int32_t gd_token;
typedef struct gd_llama_batch {        /* llama.h's struct llama_batch, field for field */
    int32_t n_tokens;
    gd_token *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} gd_llama_batch;

static void put_i32s(sb *s, const char *k, const int32_t *v, int32_t n) {
    char num[16];
    key(s, k);
    if (!v) { put(s, "null", 4); return; }
    put(s, "[", 1);
    for (int32_t i = 0; i < n; i++) {
        int len = snprintf(num, sizeof num, i ? ",%d" : "%d", v[i]);
        put(s, num, (size_t)len);
    }
    put(s, "]", 1);
}

/* One llama_decode call as a "batch" line, as gdtrace_encode does (returns the length it needs). Absent
   arrays are null: llama.cpp fills positions, sequence 0 and the last row's output itself. */
EXPORT size_t gdtrace_encode_batch(const gd_llama_batch *b, int64_t pid, int64_t tid, int64_t ctx, int64_t t0_ns,
                                   int64_t t1_ns, int64_t ret, char *buf, size_t cap) {
    sb s = {buf, cap, 0};
    char num[16];
    int32_t n = b->n_tokens > 0 ? b->n_tokens : 0;
    put(&s, "{\"ev\":\"batch\"", 13);
    put_int(&s, "pid", pid); put_int(&s, "tid", tid); put_int(&s, "ctx", ctx);
    put_int(&s, "t0_ns", t0_ns); put_int(&s, "t1_ns", t1_ns); put_int(&s, "ret", ret);
    put_int(&s, "n_tokens", b->n_tokens);
    if (b->embd && !b->token) { key(&s, "embd"); put(&s, "true", 4); }
    else put_i32s(&s, "tokens", b->token, n);
    put_i32s(&s, "pos", b->pos, n);
    key(&s, "seq");
    if (!b->seq_id || !b->n_seq_id) put(&s, "null", 4);
    else {
        put(&s, "[", 1);
        for (int32_t i = 0; i < n; i++) {
            if (i) put(&s, ",", 1);
            put(&s, "[", 1);
            for (int32_t j = 0; b->seq_id[i] && j < b->n_seq_id[i]; j++) {
                int len = snprintf(num, sizeof num, j ? ",%d" : "%d", b->seq_id[i][j]);
                put(&s, num, (size_t)len);
            }
            put(&s, "]", 1);
        }
        put(&s, "]", 1);
    }
    key(&s, "out");
    if (!b->logits) put(&s, "null", 4);
    else {
        put(&s, "[", 1);
        for (int32_t i = 0, first = 1; i < n; i++) {
            if (!b->logits[i]) continue;
            int len = snprintf(num, sizeof num, first ? "%d" : ",%d", i);
            put(&s, num, (size_t)len);
            first = 0;
        }
        put(&s, "]", 1);
    }
    put(&s, "}\n", 2);
    if (s.len < cap) buf[s.len] = 0;
    return s.len;
}

EXPORT void gdtrace_rec_init(gd_rec *r) { /* every number absent */
    memset(r, 0, sizeof *r);
    int64_t *n = &r->pid;
    for (; n <= &r->mem_free_after; n++) *n = GD_NONE;
    r->n_kernel_names = -1;
}

/* ---- output ------------------------------------------------------------------------------------------- */
/* Lines go to a buffer that a flusher thread writes out every GD_FLUSH_NS, when it fills, at a rare call
   (capture, instantiate, update, destroy, an error: written at once with what is buffered before them),
   at gdtrace_flush / detach, and at exit (the library's destructor). Only the per-token lines (graph
   launches, synchronisations, decode batches) wait: one write(2) per line cost llama-bench ~8 % of its
   tokens per second (H100, tiny F16, 2026-12-07). A process killed outright (SIGKILL, a crash) loses at
   most the last GD_FLUSH_NS of them. */
#define GD_BUF (256 * 1024)
#define GD_FLUSH_NS 20000000L
static int out_fd = -1;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static char out_buf[GD_BUF];
static size_t out_len;
static int flusher_on;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);   /* Python's time.monotonic_ns: the same clock */
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void write_all(const char *p, size_t n) {   /* under out_mu */
    for (size_t off = 0; out_fd >= 0 && off < n;) {
        ssize_t w = write(out_fd, p + off, n - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
}

static void flush_locked(void) {
    write_all(out_buf, out_len);
    out_len = 0;
}

static void *flush_loop(void *arg) {
    struct timespec dt = {0, GD_FLUSH_NS};
    (void)arg;
    for (;;) {
        nanosleep(&dt, NULL);
        pthread_mutex_lock(&out_mu);
        if (out_len) flush_locked();
        pthread_mutex_unlock(&out_mu);
    }
    return NULL;
}

static void start_flusher(void) {         /* under out_mu; every signal blocked in it (CMD's own go elsewhere) */
    sigset_t all, old;
    pthread_t t;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&t, NULL, flush_loop, NULL) == 0) {
        pthread_detach(t);
        flusher_on = 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static int64_t pid_seen;                 /* this process's id, read once: see my_pid */

static void forked_child(void) {          /* the parent's buffered lines are the parent's to write */
    pthread_mutex_init(&out_mu, NULL);
    out_len = 0;
    flusher_on = 0;
    pid_seen = 0;                         /* the child reads its own */
}

static void register_fork(void) { pthread_atfork(NULL, NULL, forked_child); }
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* The process's and the calling thread's ids, each a system call, read once (a forked child reads both anew):
   they were read at every recorded call, a decode's dozen synchronisations included, before knowing whether
   the call is written at all. */
static __thread int64_t tl_tid, tl_tid_pid;

static int64_t my_pid(void) {
    int64_t p = __atomic_load_n(&pid_seen, __ATOMIC_RELAXED);
    if (!p) {
        pthread_once(&fork_once, register_fork);
        p = (int64_t)getpid();
        __atomic_store_n(&pid_seen, p, __ATOMIC_RELAXED);
    }
    return p;
}

static int64_t my_tid(void) {
    int64_t p = my_pid();
    if (tl_tid_pid != p) {
        tl_tid = (int64_t)syscall(SYS_gettid);
        tl_tid_pid = p;
    }
    return tl_tid;
}

static void write_line(const char *line, size_t n, int urgent) {
    pthread_mutex_lock(&out_mu);
    if (out_fd >= 0) {
        if (out_len + n > GD_BUF) flush_locked();
        if (n > GD_BUF) {
            write_all(line, n);
        } else {
            memcpy(out_buf + out_len, line, n);
            out_len += n;
        }
        if (urgent) flush_locked();
        else if (!flusher_on) start_flusher();
    }
    pthread_mutex_unlock(&out_mu);
    if (!urgent) pthread_once(&fork_once, register_fork);
}

static int64_t own_ns;                 /* ns spent in this library's callbacks: gdtrace_own_ns */
static int started;

/* At exit: the buffered lines, and this process's own time in the library ("own": what tracing cost it). */
__attribute__((destructor)) static void flush_at_exit(void) {
    char line[160];
    int n = started ? snprintf(line, sizeof line, "{\"ev\":\"own\",\"pid\":%lld,\"t_ns\":%lld,\"own_ns\":%lld}\n",
                               (long long)my_pid(), (long long)now_ns(),
                               (long long)__atomic_load_n(&own_ns, __ATOMIC_RELAXED)) : 0;
    pthread_mutex_lock(&out_mu);
    if (n > 0 && (size_t)n < sizeof line && out_len + (size_t)n <= GD_BUF) {
        memcpy(out_buf + out_len, line, (size_t)n);
        out_len += (size_t)n;
    }
    flush_locked();
    pthread_mutex_unlock(&out_mu);
}

static void emit(const gd_rec *r, int urgent) {
    char small[4096], *line = small;
    size_t n = gdtrace_encode(r, small, sizeof small);
    if (n >= sizeof small) {
        if (!(line = malloc(n + 1))) return;
        gdtrace_encode(r, line, n + 1);
    }
    write_line(line, n, urgent);
    if (line != small) free(line);
}

static void emit_error(const char *text) {
    gd_rec r;
    gdtrace_rec_init(&r);
    r.ev = "error"; r.pid = my_pid(); r.t0_ns = now_ns(); r.text = text;
    emit(&r, 1);
}

/* ---- CUPTI and libcuda, resolved at init -------------------------------------------------------------- */
#define FN(name) static __typeof__(name) *p_##name
FN(cuptiSubscribe); FN(cuptiEnableCallback); FN(cuptiGetResultString); FN(cuptiGetGraphId);
FN(cuptiGetGraphExecId); FN(cuptiGetStreamId); FN(cuptiGetDeviceId);
FN(cuGraphGetNodes); FN(cuGraphNodeGetType); FN(cuGraphKernelNodeGetParams); FN(cuFuncGetName);
FN(cuKernelGetName); FN(cuMemGetInfo);
#define LOAD(lib, name) (p_##name = (__typeof__(p_##name))dlsym(lib, XSTR(name)))

enum op { BEGIN, END, INSTANTIATE, UPDATE, LAUNCH, DESTROY, SYNC_STREAM, SYNC_DEVICE, SYNC_CONTEXT };
static const char *const OP_FN[] = {"cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
    "cudaGraphExecUpdate", "cudaGraphLaunch", "cudaGraphExecDestroy", "cudaStreamSynchronize",
    "cudaDeviceSynchronize", "cuCtxSynchronize"};

#define RT(n) CUPTI_RUNTIME_TRACE_CBID_##n
#define DRV(n) CUPTI_DRIVER_TRACE_CBID_##n
static const struct { CUpti_CallbackId cbid; enum op op; } RT_OPS[] = {
    {RT(cudaStreamBeginCapture_v10000), BEGIN}, {RT(cudaStreamBeginCapture_ptsz_v10000), BEGIN},
    {RT(cudaStreamEndCapture_v10000), END}, {RT(cudaStreamEndCapture_ptsz_v10000), END},
    {RT(cudaGraphInstantiate_v10000), INSTANTIATE}, {RT(cudaGraphInstantiate_v12000), INSTANTIATE},
    {RT(cudaGraphInstantiateWithFlags_v11040), INSTANTIATE},
    {RT(cudaGraphInstantiateWithParams_v12000), INSTANTIATE},
    {RT(cudaGraphInstantiateWithParams_ptsz_v12000), INSTANTIATE}, {RT(cudaGraphExecUpdate_v10020), UPDATE},
    {RT(cudaGraphLaunch_v10000), LAUNCH}, {RT(cudaGraphLaunch_ptsz_v10000), LAUNCH},
    {RT(cudaGraphExecDestroy_v10000), DESTROY}, {RT(cudaStreamSynchronize_v3020), SYNC_STREAM},
    {RT(cudaStreamSynchronize_ptsz_v7000), SYNC_STREAM}, {RT(cudaDeviceSynchronize_v3020), SYNC_DEVICE},
}, DRV_OPS[] = {
    {DRV(cuStreamBeginCapture), BEGIN}, {DRV(cuStreamBeginCapture_ptsz), BEGIN},
    {DRV(cuStreamBeginCapture_v2), BEGIN}, {DRV(cuStreamBeginCapture_v2_ptsz), BEGIN},
    {DRV(cuStreamEndCapture), END}, {DRV(cuStreamEndCapture_ptsz), END},
    {DRV(cuGraphInstantiate), INSTANTIATE}, {DRV(cuGraphInstantiate_v2), INSTANTIATE},
    {DRV(cuGraphInstantiateWithFlags), INSTANTIATE}, {DRV(cuGraphInstantiateWithParams), INSTANTIATE},
    {DRV(cuGraphInstantiateWithParams_ptsz), INSTANTIATE}, {DRV(cuGraphExecUpdate_v2), UPDATE},
    {DRV(cuGraphLaunch), LAUNCH}, {DRV(cuGraphLaunch_ptsz), LAUNCH}, {DRV(cuGraphExecDestroy), DESTROY},
    {DRV(cuStreamSynchronize), SYNC_STREAM}, {DRV(cuStreamSynchronize_ptsz), SYNC_STREAM},
    {DRV(cuCtxSynchronize), SYNC_CONTEXT}, {DRV(cuCtxSynchronize_v2), SYNC_CONTEXT},
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* fn_<name>: the real function behind this library's `name`, found once by `find(name, self)` (NULL: none) */
#define CACHED(type, name, find) \
    static type real_##name; \
    type fn_##name = __atomic_load_n(&real_##name, __ATOMIC_ACQUIRE); \
    if (!fn_##name) { \
        fn_##name = (type)find(#name, (void *)name); \
        if (fn_##name) __atomic_store_n(&real_##name, fn_##name, __ATOMIC_RELEASE); \
    }

static __thread int tl_runtime_depth;   /* inside a recorded runtime call: its driver calls are not recorded */
static __thread int tl_self;            /* inside this library's own driver calls */
static __thread int64_t tl_mem_before, tl_exec_entered;

static int op_of(CUpti_CallbackDomain dom, CUpti_CallbackId cbid) {
    size_t n = dom == CUPTI_CB_DOMAIN_RUNTIME_API ? N_OF(RT_OPS) : N_OF(DRV_OPS);
    for (size_t i = 0; i < n; i++) {
        if (dom == CUPTI_CB_DOMAIN_RUNTIME_API ? RT_OPS[i].cbid == cbid : DRV_OPS[i].cbid == cbid)
            return dom == CUPTI_CB_DOMAIN_RUNTIME_API ? (int)RT_OPS[i].op : (int)DRV_OPS[i].op;
    }
    return -1;
}

static int64_t mem_free(void) {
    size_t free_b = 0, total = 0;
    tl_self++;
    CUresult rc = p_cuMemGetInfo ? p_cuMemGetInfo(&free_b, &total) : CUDA_ERROR_NOT_FOUND;
    tl_self--;
    return rc == CUDA_SUCCESS ? (int64_t)free_b : GD_NONE;
}

static int64_t graph_id(CUgraph g) { uint32_t id; return g && !p_cuptiGetGraphId(g, &id) ? id : GD_NONE; }
static int64_t exec_id(CUgraphExec e) { uint32_t id; return e && !p_cuptiGetGraphExecId(e, &id) ? id : GD_NONE; }

static const char *kernel_name(CUgraphNode node) { /* NULL: not a kernel node */
    CUgraphNodeType type;
    CUDA_KERNEL_NODE_PARAMS p;
    const char *name = NULL;
    if (p_cuGraphNodeGetType(node, &type) || type != CU_GRAPH_NODE_TYPE_KERNEL) return NULL;
    memset(&p, 0, sizeof p);
    if (p_cuGraphKernelNodeGetParams(node, &p)) return "?";
    if (p.func && p_cuFuncGetName && !p_cuFuncGetName(&name, p.func) && name) return name;
    if (p.kern && p_cuKernelGetName && !p_cuKernelGetName(&name, p.kern) && name) return name;
    return "?";
}

static CUgraphNode *graph_nodes(CUgraph g, size_t *n) {
    CUgraphNode *nodes;
    *n = 0;
    if (p_cuGraphGetNodes(g, NULL, n) || !*n || !(nodes = calloc(*n, sizeof *nodes))) return NULL;
    if (p_cuGraphGetNodes(g, nodes, n)) { free(nodes); *n = 0; return NULL; }
    return nodes;
}

/* A captured graph: node and kernel-node counts, kernel names in cuGraphGetNodes order (names: freed by caller) */
static const char **describe_graph(CUgraph g, gd_rec *r) {
    size_t n;
    CUgraphNode *nodes = graph_nodes(g, &n);
    const char **names = calloc(n ? n : 1, sizeof *names);
    int64_t k = 0;
    for (size_t i = 0; nodes && names && i < n; i++) {
        const char *name = kernel_name(nodes[i]);
        if (name) names[k++] = name;
    }
    r->nodes = (int64_t)n;
    r->kernel_nodes = k;
    r->kernel_names = names;
    r->n_kernel_names = names ? k : -1;
    free(nodes);
    return names;
}

static void describe_error_node(CUgraph g, CUgraphNode err, CUgraphNode from, gd_rec *r) {
    size_t n;
    CUgraphNode *nodes = graph_nodes(g, &n);
    int64_t kernels = 0;
    r->error_node = err != NULL;
    for (size_t i = 0; err && nodes && i < n; i++) {
        if (nodes[i] == err) {
            r->error_node_index = (int64_t)i;
            r->error_node_kernel = kernel_name(err);
            r->error_node_kernel_index = r->error_node_kernel ? kernels : GD_NONE;
            break;
        }
        kernels += kernel_name(nodes[i]) != NULL;
    }
    if (from) r->error_from_kernel = kernel_name(from);
    free(nodes);
}

/* Synchronisations are written only where they can matter: the first of a stream after a graph launch on it,
   the first of a device (cudaDeviceSynchronize, cuCtxSynchronize) after a launch on any of its streams. That is
   all graphdiag's in-flight check reads, and it keeps a decode loop's dozen syncs per token from costing a
   line each (llama.cpp synchronises its streams many times per token). Streams launched on since their last
   written sync: a small set, scanned; past GD_DIRTY of them every sync is written. */
#define GD_DIRTY 64
static struct { CUstream stream; int64_t device; } dirty[GD_DIRTY];
static int n_dirty, dirty_overflow;
static pthread_mutex_t dirty_mu = PTHREAD_MUTEX_INITIALIZER;

static void launched_on(CUstream stream, int64_t device) {
    pthread_mutex_lock(&dirty_mu);
    int i = 0;
    while (i < n_dirty && dirty[i].stream != stream) i++;
    if (i == n_dirty) {
        if (n_dirty < GD_DIRTY) { dirty[n_dirty].stream = stream; dirty[n_dirty++].device = device; }
        else dirty_overflow = 1;
    }
    pthread_mutex_unlock(&dirty_mu);
}

/* Whether this sync is written: it clears the stream's (or the device's streams') launches if any. */
static int sync_clears(enum op op, CUstream stream, int64_t device) {
    int any = 0;
    pthread_mutex_lock(&dirty_mu);
    for (int i = 0; i < n_dirty;) {
        if (op == SYNC_STREAM ? dirty[i].stream == stream : dirty[i].device == device) {
            dirty[i] = dirty[--n_dirty];
            any = 1;
        } else i++;
    }
    any |= dirty_overflow;
    pthread_mutex_unlock(&dirty_mu);
    return any;
}

/* Reads one call's parameters (by the layout generated_cuda*_meta.h gives them) and its result, at API_EXIT. */
static void record(enum op op, int runtime, const CUpti_CallbackData *cb, int64_t t_exit) {
    const void *prm = cb->functionParams;
    const char **names = NULL;
    CUstream stream = NULL;
    gd_rec r;
    uint32_t u;
    gdtrace_rec_init(&r);
    r.t1_ns = t_exit;
    /* most synchronisations are not written (sync_clears): that is known before anything else is read */
    if (op == SYNC_STREAM && !sync_clears(op, *(CUstream const *)prm, GD_NONE)) return;
    if (cb->context && !p_cuptiGetDeviceId(cb->context, &u)) r.device = u;
    if ((op == SYNC_DEVICE || op == SYNC_CONTEXT) && !sync_clears(op, NULL, r.device)) return;
    r.fn = OP_FN[op]; r.api = runtime ? "runtime" : "driver";
    r.pid = my_pid(); r.tid = my_tid();
    r.t0_ns = (int64_t)*cb->correlationData;
    r.ret = runtime ? (int64_t)*(const cudaError_t *)cb->functionReturnValue
                    : (int64_t)*(const CUresult *)cb->functionReturnValue;
    tl_self++;
    switch (op) {
    case BEGIN: /* both layouts start with the stream */
        stream = *(CUstream const *)prm;
        break;
    case END: {
        const cuStreamEndCapture_params *p = prm;     /* = cudaStreamEndCapture_v10000_params */
        stream = p->hStream;
        if (!r.ret && p->phGraph && *p->phGraph) {
            r.graph = graph_id(*p->phGraph);
            names = describe_graph(*p->phGraph, &r);
        }
        break;
    }
    case INSTANTIATE: {
        const cuGraphInstantiateWithFlags_params *p = prm;  /* every variant: (CUgraphExec *, CUgraph, ...) */
        r.graph = graph_id(p->hGraph);
        if (!r.ret && p->phGraphExec) r.exec = exec_id(*p->phGraphExec);
        r.mem_free_before = tl_mem_before;
        r.mem_free_after = mem_free();
        break;
    }
    case UPDATE: {
        const cuGraphExecUpdate_v2_params *p = prm;   /* = cudaGraphExecUpdate_v10020_params */
        r.exec = exec_id(p->hGraphExec);
        r.graph = graph_id(p->hGraph);
        if (p->resultInfo) {
            r.update_result = p->resultInfo->result;
            describe_error_node(p->hGraph, p->resultInfo->errorNode, p->resultInfo->errorFromNode, &r);
        }
        break;
    }
    case LAUNCH: {
        const cuGraphLaunch_params *p = prm;          /* = cudaGraphLaunch_v10000_params */
        r.exec = exec_id(p->hGraph);
        stream = p->hStream;
        break;
    }
    case DESTROY:
        r.exec = tl_exec_entered;                     /* its id, read before it was destroyed */
        break;
    case SYNC_STREAM:
        stream = *(CUstream const *)prm;
        break;
    default:
        break;
    }
    if (op == LAUNCH) launched_on(stream, r.device);
    if (op == BEGIN || op == END || op == LAUNCH || op == SYNC_STREAM)
        r.stream = cb->context && !p_cuptiGetStreamId(cb->context, stream, &u) ? (int64_t)u : (stream ? -1 : 0);
    tl_self--;
    emit(&r, !(op == LAUNCH || op == SYNC_STREAM || op == SYNC_DEVICE || op == SYNC_CONTEXT));
    free(names);
}

static void CUPTIAPI on_callback(void *user, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *data) {
    const CUpti_CallbackData *cb = data;
    int runtime = dom == CUPTI_CB_DOMAIN_RUNTIME_API, op;
    (void)user;
    if (tl_self || (!runtime && tl_runtime_depth > 0) || (op = op_of(dom, cbid)) < 0) return;
    /* One clock read on the way in and one on the way out: the call's start is stamped with the first
       (a fresh read only after this library's own driver calls), its end with the exit callback's first. A
       decode loop's unwritten synchronisations pass through here a dozen times a token. */
    int64_t t_in = now_ns();
    if (cb->callbackSite == CUPTI_API_ENTER) {
        tl_runtime_depth += runtime;
        int64_t t_out = t_in;
        if (op == INSTANTIATE || op == DESTROY) {
            if (op == INSTANTIATE) tl_mem_before = mem_free();
            if (op == DESTROY) {
                tl_self++;
                tl_exec_entered = exec_id(*(CUgraphExec const *)cb->functionParams);
                tl_self--;
            }
            t_out = now_ns();
        }
        *cb->correlationData = (uint64_t)t_out;
        __atomic_add_fetch(&own_ns, (t_out == t_in ? now_ns() : t_out) - t_in, __ATOMIC_RELAXED);
        return;
    }
    tl_runtime_depth -= runtime;
    if (out_fd >= 0) record((enum op)op, runtime, cb, t_in);
    __atomic_add_fetch(&own_ns, now_ns() - t_in, __ATOMIC_RELAXED);
}

/* ---- GRAPHDIAG_TRACE_API=interpose: the runtime's calls read by interposing them, no CUPTI -----------------
   Built with GD_INTERPOSE (a second build: build.py, when GRAPHDIAG_TRACE_API=interpose) and loaded through
   LD_PRELOAD, this library defines the CUDA runtime's graph and sync functions; a program linked against a
   shared libcudart (llama.cpp's builds, PyTorch) calls them here, and each goes on to the real one (see
   real_rt). CUPTI is never subscribed: what CUPTI gave is read from libcuda (kernel names, update's error node,
   cudaGetDevice) or kept here (graph, executable and stream ids: serials, from a table of the live
   ones by handle). Not seen: calls made through the driver API (cuda-python, cuGraphLaunch), and programs
   whose cudart is linked statically (their calls never reach these symbols, so their trace shows no graph
   call: --api cupti reads them; where such a program exports the runtime's symbols ahead of this library,
   `start` falls back to CUPTI itself). */
#ifdef GD_INTERPOSE
static int interposing;

#define GD_IDS 4096                       /* live graphs and executables a table keeps: past it, ids are absent */
typedef struct { const void *handle; int64_t id; } gd_id;
static gd_id graph_ids[GD_IDS], exec_ids[GD_IDS];
static int64_t next_graph_id = 1, next_exec_id = 1;
static pthread_mutex_t ids_mu = PTHREAD_MUTEX_INITIALIZER;
#define GD_TOMB ((const void *)1)

static size_t id_slot(const void *h) {   /* a handle's home slot: its bits mixed (Fibonacci hashing) */
    uintptr_t x = (uintptr_t)h;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 52) % GD_IDS;
}

static int64_t id_new(gd_id *t, int64_t *next, const void *h) {   /* a fresh id for h (replacing any) */
    int64_t id = GD_NONE;
    pthread_mutex_lock(&ids_mu);
    size_t i = id_slot(h), tomb = GD_IDS;
    for (size_t k = 0; k < GD_IDS; k++, i = (i + 1) % GD_IDS) {
        if (t[i].handle == h || !t[i].handle) { tomb = tomb < GD_IDS ? tomb : i; break; }
        if (t[i].handle == GD_TOMB && tomb == GD_IDS) tomb = i;
    }
    if (tomb < GD_IDS) {
        if (t[tomb].handle != h) for (size_t k = 0, j = i; k < GD_IDS && t[j].handle; k++, j = (j + 1) % GD_IDS)
            if (t[j].handle == h) { t[j].handle = GD_TOMB; break; }
        t[tomb].handle = h; t[tomb].id = id = (*next)++;
    }
    pthread_mutex_unlock(&ids_mu);
    return id;
}

static int64_t id_of(gd_id *t, const void *h, int drop) {
    int64_t id = GD_NONE;
    if (!h) return id;
    pthread_mutex_lock(&ids_mu);
    size_t i = id_slot(h);
    for (size_t k = 0; k < GD_IDS && t[i].handle; k++, i = (i + 1) % GD_IDS)
        if (t[i].handle == h) { id = t[i].id; if (drop) t[i].handle = GD_TOMB; break; }
    pthread_mutex_unlock(&ids_mu);
    return id;
}

/* Streams: serials by handle, as graphs and executables (NULL, the legacy stream: 0). The device: cudaGetDevice,
   the runtime's own. No driver call around a capture: with cuStreamGetId and cuCtxGetDevice read here right
   after cudaStreamBeginCapture, torch's capture (global mode) failed before its end (H100, 2026-12-07; which of
   the two ended it was not isolated), as an unsafe call during a global-mode capture invalidates it. */
static void *real_rt(const char *name, void *self);
typedef cudaError_t (*rt_get_device_fn)(int *);
static int64_t cur_device(void) {
    static rt_get_device_fn get;
    rt_get_device_fn fn = __atomic_load_n(&get, __ATOMIC_ACQUIRE);
    int d;
    if (!fn) {
        if (!(fn = (rt_get_device_fn)real_rt("cudaGetDevice", NULL))) return GD_NONE;
        __atomic_store_n(&get, fn, __ATOMIC_RELEASE);
    }
    return fn(&d) == cudaSuccess ? (int64_t)d : GD_NONE;
}

static gd_id stream_ids[GD_IDS];
static int64_t next_stream_id = 1;
static int64_t stream_id(CUstream s) {
    int64_t id;
    if (!s) return 0;
    id = id_of(stream_ids, s, 0);
    return id != GD_NONE ? id : id_new(stream_ids, &next_stream_id, s);
}

static void interposed(enum op op, gd_rec *r, int64_t t0, int64_t ret) {   /* fills the common fields, writes */
    r->fn = OP_FN[op]; r->api = "runtime";
    r->pid = my_pid(); r->tid = my_tid(); r->t0_ns = t0; r->t1_ns = now_ns(); r->ret = ret;
    emit(r, !(op == LAUNCH || op == SYNC_STREAM || op == SYNC_DEVICE || op == SYNC_CONTEXT));
}

/* The runtime's own `name`, behind this library's `self`: the next definition in the global scope (a program
   linked against libcudart), else libcudart's loaded under one of its names (loaded RTLD_LOCAL: Python's
   extension modules, torch's), else any loaded object's that is not this library's. */
static int other_definition(struct dl_phdr_info *info, size_t size, void *data) {
    void **want = data;                   /* {name, self, found} */
    (void)size;
    if (!info->dlpi_name || !*info->dlpi_name) return 0;
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    void *fn = h ? dlsym(h, (const char *)want[0]) : NULL;
    if (h) dlclose(h);
    if (fn && fn != want[1]) { want[2] = fn; return 1; }
    return 0;
}

static void *real_rt(const char *name, void *self) {
    static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
    void *fn = dlsym(RTLD_NEXT, name);
    for (size_t i = 0; (!fn || fn == self) && i < N_OF(sonames); i++) {
        void *h = dlopen(sonames[i], RTLD_LAZY | RTLD_NOLOAD);
        fn = h ? dlsym(h, name) : NULL;
        if (h) dlclose(h);
    }
    if (!fn || fn == self) {
        void *want[3] = {(void *)name, self, NULL};
        dl_iterate_phdr(other_definition, want);
        fn = want[2];
    }
    return fn;
}

#define FORWARD(type, name) \
    CACHED(type, name, real_rt) \
    if (!fn_##name) return cudaErrorInsufficientDriver;  /* no runtime behind this library */

typedef cudaError_t (*rt_launch_fn)(CUgraphExec, CUstream);
typedef cudaError_t (*rt_stream_fn)(CUstream);
typedef cudaError_t (*rt_void_fn)(void);
typedef cudaError_t (*rt_begin_fn)(CUstream, enum cudaStreamCaptureMode);
typedef cudaError_t (*rt_end_fn)(CUstream, CUgraph *);
typedef cudaError_t (*rt_inst_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef cudaError_t (*rt_inst_params_fn)(CUgraphExec *, CUgraph, cudaGraphInstantiateParams *);
typedef cudaError_t (*rt_update_fn)(CUgraphExec, CUgraph, cudaGraphExecUpdateResultInfo *);
typedef cudaError_t (*rt_exec_fn)(CUgraphExec);
typedef cudaError_t (*rt_graph_fn)(CUgraph);

static cudaError_t launch_(rt_launch_fn fn, CUgraphExec exec, CUstream stream) {
    if (!interposing) return fn(exec, stream);
    int64_t t0 = now_ns();
    cudaError_t ret = fn(exec, stream);
    int64_t t_in = now_ns();
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device(); r.exec = id_of(exec_ids, exec, 0); r.stream = stream_id(stream);
    launched_on(stream, r.device);
    interposed(LAUNCH, &r, t0, ret);
    __atomic_add_fetch(&own_ns, now_ns() - t_in, __ATOMIC_RELAXED);
    return ret;
}
EXPORT cudaError_t cudaGraphLaunch(CUgraphExec exec, CUstream stream) {
    FORWARD(rt_launch_fn, cudaGraphLaunch) return launch_(fn_cudaGraphLaunch, exec, stream);
}
EXPORT cudaError_t cudaGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    FORWARD(rt_launch_fn, cudaGraphLaunch_ptsz) return launch_(fn_cudaGraphLaunch_ptsz, exec, stream);
}

static cudaError_t sync_(rt_stream_fn fn, CUstream stream) {
    if (!interposing) return fn(stream);
    int64_t t0 = now_ns();
    cudaError_t ret = fn(stream);
    int64_t t_in = now_ns();
    if (sync_clears(SYNC_STREAM, stream, GD_NONE)) {
        gd_rec r;
        gdtrace_rec_init(&r);
        r.device = cur_device(); r.stream = stream_id(stream);
        interposed(SYNC_STREAM, &r, t0, ret);
    }
    __atomic_add_fetch(&own_ns, now_ns() - t_in, __ATOMIC_RELAXED);
    return ret;
}
EXPORT cudaError_t cudaStreamSynchronize(CUstream stream) {
    FORWARD(rt_stream_fn, cudaStreamSynchronize) return sync_(fn_cudaStreamSynchronize, stream);
}
EXPORT cudaError_t cudaStreamSynchronize_ptsz(CUstream stream) {
    FORWARD(rt_stream_fn, cudaStreamSynchronize_ptsz) return sync_(fn_cudaStreamSynchronize_ptsz, stream);
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
    FORWARD(rt_void_fn, cudaDeviceSynchronize)
    if (!interposing) return fn_cudaDeviceSynchronize();
    int64_t t0 = now_ns();
    cudaError_t ret = fn_cudaDeviceSynchronize();
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device();
    if (sync_clears(SYNC_DEVICE, NULL, r.device)) interposed(SYNC_DEVICE, &r, t0, ret);
    return ret;
}

static cudaError_t begin_(rt_begin_fn fn, CUstream stream, enum cudaStreamCaptureMode mode) {
    if (!interposing) return fn(stream, mode);
    int64_t t0 = now_ns();
    cudaError_t ret = fn(stream, mode);
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device(); r.stream = stream_id(stream);
    interposed(BEGIN, &r, t0, ret);
    return ret;
}
EXPORT cudaError_t cudaStreamBeginCapture(CUstream stream, enum cudaStreamCaptureMode mode) {
    FORWARD(rt_begin_fn, cudaStreamBeginCapture) return begin_(fn_cudaStreamBeginCapture, stream, mode);
}
EXPORT cudaError_t cudaStreamBeginCapture_ptsz(CUstream stream, enum cudaStreamCaptureMode mode) {
    FORWARD(rt_begin_fn, cudaStreamBeginCapture_ptsz) return begin_(fn_cudaStreamBeginCapture_ptsz, stream, mode);
}

static cudaError_t end_(rt_end_fn fn, CUstream stream, CUgraph *graph) {
    if (!interposing) return fn(stream, graph);
    int64_t t0 = now_ns();
    cudaError_t ret = fn(stream, graph);
    const char **names = NULL;
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device(); r.stream = stream_id(stream);
    if (!ret && graph && *graph) {
        r.graph = id_new(graph_ids, &next_graph_id, *graph);
        names = describe_graph(*graph, &r);
    }
    interposed(END, &r, t0, ret);
    free(names);
    return ret;
}
EXPORT cudaError_t cudaStreamEndCapture(CUstream stream, CUgraph *graph) {
    FORWARD(rt_end_fn, cudaStreamEndCapture) return end_(fn_cudaStreamEndCapture, stream, graph);
}
EXPORT cudaError_t cudaStreamEndCapture_ptsz(CUstream stream, CUgraph *graph) {
    FORWARD(rt_end_fn, cudaStreamEndCapture_ptsz) return end_(fn_cudaStreamEndCapture_ptsz, stream, graph);
}

static void instantiated(CUgraphExec *exec, CUgraph graph, int64_t t0, int64_t mem0, cudaError_t ret) {
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device(); r.graph = id_of(graph_ids, graph, 0);
    if (!ret && exec && *exec) r.exec = id_new(exec_ids, &next_exec_id, *exec);
    r.mem_free_before = mem0; r.mem_free_after = mem_free();
    interposed(INSTANTIATE, &r, t0, ret);
}
#define INSTANTIATE_FN(name, type, arg_t) \
    EXPORT cudaError_t name(CUgraphExec *exec, CUgraph graph, arg_t arg) { \
        FORWARD(type, name) \
        if (!interposing) return fn_##name(exec, graph, arg); \
        int64_t t0 = now_ns(), mem0 = mem_free(); \
        cudaError_t ret = fn_##name(exec, graph, arg); \
        instantiated(exec, graph, t0, mem0, ret); \
        return ret; \
    }
INSTANTIATE_FN(cudaGraphInstantiate, rt_inst_fn, unsigned long long)
INSTANTIATE_FN(cudaGraphInstantiateWithFlags, rt_inst_fn, unsigned long long)
INSTANTIATE_FN(cudaGraphInstantiateWithParams, rt_inst_params_fn, cudaGraphInstantiateParams *)
INSTANTIATE_FN(cudaGraphInstantiateWithParams_ptsz, rt_inst_params_fn, cudaGraphInstantiateParams *)

EXPORT cudaError_t cudaGraphExecUpdate(CUgraphExec exec, CUgraph graph, cudaGraphExecUpdateResultInfo *info) {
    FORWARD(rt_update_fn, cudaGraphExecUpdate)
    if (!interposing) return fn_cudaGraphExecUpdate(exec, graph, info);
    int64_t t0 = now_ns();
    cudaError_t ret = fn_cudaGraphExecUpdate(exec, graph, info);
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device(); r.exec = id_of(exec_ids, exec, 0); r.graph = id_of(graph_ids, graph, 0);
    if (info) {
        r.update_result = info->result;
        describe_error_node(graph, info->errorNode, info->errorFromNode, &r);
    }
    interposed(UPDATE, &r, t0, ret);
    return ret;
}

EXPORT cudaError_t cudaGraphExecDestroy(CUgraphExec exec) {
    FORWARD(rt_exec_fn, cudaGraphExecDestroy)
    if (!interposing) return fn_cudaGraphExecDestroy(exec);
    int64_t t0 = now_ns(), id = id_of(exec_ids, exec, 1);
    cudaError_t ret = fn_cudaGraphExecDestroy(exec);
    gd_rec r;
    gdtrace_rec_init(&r);
    r.device = cur_device(); r.exec = id;
    interposed(DESTROY, &r, t0, ret);
    return ret;
}

EXPORT cudaError_t cudaGraphDestroy(CUgraph graph) {       /* not written: its id leaves the table */
    FORWARD(rt_graph_fn, cudaGraphDestroy)
    if (interposing) id_of(graph_ids, graph, 1);
    return fn_cudaGraphDestroy(graph);
}

/* Whether this process's runtime calls reach the interposers: the symbol resolves to this library's (its
   LD_PRELOAD came first). */
static int can_interpose(void) {
    return dlsym(RTLD_DEFAULT, "cudaGraphLaunch") == (void *)cudaGraphLaunch;
}
#else
static int can_interpose(void) { return 0; }
#endif

/* ---- the entry point the CUDA driver calls ------------------------------------------------------------ */
static int start(void) {
    static char why[512];
    const char *path = getenv("GRAPHDIAG_CUPTI_PATH");
    const char *api = getenv("GRAPHDIAG_TRACE_API");
    gd_rec r;
    /* GRAPHDIAG_TRACE_API=off: no CUPTI at all (only llama_decode's batches, interposed, are written) — with
       `none` (CUPTI subscribed, no callback enabled) a measure of where tracing's cost lies (bench trace). */
    if (api && !strcmp(api, "interpose") && can_interpose()) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!cuda) { emit_error("no CUDA driver: libcuda.so.1 could not be opened"); return 0; }
        if (!LOAD(cuda, cuGraphGetNodes) || !LOAD(cuda, cuGraphNodeGetType) || !LOAD(cuda, cuGraphKernelNodeGetParams)
            || !LOAD(cuda, cuMemGetInfo)) {
            snprintf(why, sizeof why, "libcuda lacks a function gdtrace needs: %s", dlerror());
            emit_error(why);
            return 0;
        }
        LOAD(cuda, cuFuncGetName); LOAD(cuda, cuKernelGetName);
#ifdef GD_INTERPOSE
        __atomic_store_n(&interposing, 1, __ATOMIC_RELEASE);
#endif
        gdtrace_rec_init(&r);
        r.ev = "start"; r.pid = my_pid(); r.t0_ns = now_ns(); r.text = "interpose";
        emit(&r, 1);
        return 1;
    }
    if (api && !strcmp(api, "off")) {
        gdtrace_rec_init(&r);
        r.ev = "start"; r.pid = my_pid(); r.t0_ns = now_ns(); r.text = "off";
        emit(&r, 1);
        return 1;
    }
    void *cupti = dlopen(path && *path ? path : "libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUpti_SubscriberHandle sub;
    CUptiResult rc;
    if (!cupti) {
        snprintf(why, sizeof why, "no CUPTI: %s", dlerror());
        emit_error(why);
        return 0;
    }
    if (!cuda) { emit_error("no CUDA driver: libcuda.so.1 could not be opened"); return 0; }
    if (!LOAD(cupti, cuptiSubscribe) || !LOAD(cupti, cuptiEnableCallback) || !LOAD(cupti, cuptiGetResultString)
        || !LOAD(cupti, cuptiGetGraphId) || !LOAD(cupti, cuptiGetGraphExecId) || !LOAD(cupti, cuptiGetStreamId)
        || !LOAD(cupti, cuptiGetDeviceId) || !LOAD(cuda, cuGraphGetNodes) || !LOAD(cuda, cuGraphNodeGetType)
        || !LOAD(cuda, cuGraphKernelNodeGetParams) || !LOAD(cuda, cuMemGetInfo)) {
        snprintf(why, sizeof why, "CUPTI or libcuda lacks a function gdtrace needs: %s", dlerror());
        emit_error(why);
        return 0;
    }
    LOAD(cuda, cuFuncGetName);            /* optional: kernel names read "?" without both */
    LOAD(cuda, cuKernelGetName);
    rc = p_cuptiSubscribe(&sub, on_callback, NULL);
    if (rc != CUPTI_SUCCESS) {
        const char *name = "?";
        p_cuptiGetResultString(rc, &name);
        snprintf(why, sizeof why, rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                 ? "CUPTI already has a subscriber in this process (a profiler such as Nsight?): %s"
                 : "CUPTI refused the subscriber: %s", name);
        emit_error(why);
        return 0;
    }
    /* GRAPHDIAG_TRACE_API=driver: the driver API's callbacks alone. The runtime's graph and sync calls reach the
       driver's, where the same calls are read (runtime names, cuCtxSynchronize for cudaDeviceSynchronize), with
       half the callbacks a call (no runtime enter and exit around the driver's): a measure of what CUPTI's
       dispatch costs per callback. A runtime call that fails before reaching the driver is not seen. */
    int none = api && !strcmp(api, "none");
    if (!none && !(api && !strcmp(api, "driver")))
        for (size_t i = 0; i < N_OF(RT_OPS); i++) p_cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, RT_OPS[i].cbid);
    for (size_t i = 0; !none && i < N_OF(DRV_OPS); i++)
        p_cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, DRV_OPS[i].cbid);
    gdtrace_rec_init(&r);
    r.ev = "start"; r.pid = my_pid(); r.t0_ns = now_ns(); r.text = path && *path ? path : "libcupti.so.13";
    emit(&r, 1);
    return 1;
}

static int out_from_env;
static pthread_once_t out_once = PTHREAD_ONCE_INIT;

static void open_out(void) {
    const char *out = getenv("GRAPHDIAG_TRACE_OUT");
    if (out && *out) out_fd = open(out, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    out_from_env = out_fd >= 0;
}

static void init_once(void) {
    pthread_once(&out_once, open_out);
    started = out_fd >= 0 && start();
}

/* llama.cpp's own function `name`, behind this library's interposer `self` (RTLD_NEXT; else, libllama loaded
   RTLD_LOCAL and calling itself, as ctypes loads it, libllama's own handle). NULL: no libllama here. */
static void *real_fn(const char *name, void *self) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (!fn) {
        void *h = dlopen("libllama.so", RTLD_LAZY | RTLD_NOLOAD);
        fn = h ? dlsym(h, name) : NULL;
        if (fn == self) fn = NULL;
    }
    return fn;
}

#define REAL(type, name) CACHED(type, name, real_fn)

static void write_batch(const gd_llama_batch *b, const void *ctx, int64_t t0, int64_t t1, int32_t ret) {
    pthread_once(&out_once, open_out);
    if (out_fd < 0) return;
    char small[8192], *line = small;
    int64_t pid = my_pid(), tid = my_tid();
    size_t n = gdtrace_encode_batch(b, pid, tid, (int64_t)(uintptr_t)ctx, t0, t1, ret, small, sizeof small);
    if (n >= sizeof small && (line = malloc(n + 1)))
        gdtrace_encode_batch(b, pid, tid, (int64_t)(uintptr_t)ctx, t0, t1, ret, line, n + 1);
    if (line) write_line(line, n, 0);
    if (line && line != small) free(line);
}

/* llama.cpp's llama_decode, interposed (LD_PRELOAD): the batch recorded, the real call made. */
typedef int32_t (*llama_decode_fn)(void *, gd_llama_batch);

EXPORT int32_t llama_decode(void *ctx, gd_llama_batch batch) {
    REAL(llama_decode_fn, llama_decode)
    if (!fn_llama_decode) return -1;      /* no libllama beside this library: nothing to call */
    int64_t t0 = now_ns();
    int32_t ret = fn_llama_decode(ctx, batch);
    write_batch(&batch, ctx, t0, now_ns(), ret);
    return ret;
}

/* ---- llama_process's llama_batch_ext ---------------------------------------------------------------------
   llama.cpp's extended batch (llama_batch_ext, llama.h since 2026; llama-server, llama-bench and common's
   batches use it) is opaque: its layout is llama.cpp's C++ internals. So its builder calls are interposed too
   and mirrored into a shadow per batch (tokens, positions, sequences, outputs), written as a "batch" line when
   llama_process decodes that batch. A batch whose shadow missed a call (it outgrew the shadow table, an add
   the real function refused) is written with n_tokens -1 and nothing else. */
#define GD_SHADOWS 32
#define GD_SEQ 4                          /* sequences a shadow keeps per token: more are cut, marked lost */
typedef struct gd_shadow {
    const void *batch;                    /* the llama_batch_ext it mirrors; NULL: a free slot */
    int32_t n, cap, lost, embd_only;
    int32_t *token, *pos, *n_seq, *seq;   /* seq: GD_SEQ per token */
    int32_t **seq_row;
    int8_t *out;
} gd_shadow;
static gd_shadow shadows[GD_SHADOWS];
static pthread_mutex_t shadow_mu = PTHREAD_MUTEX_INITIALIZER;

static gd_shadow *shadow_of(const void *batch, int make) {   /* under shadow_mu */
    gd_shadow *free_slot = NULL;
    for (int i = 0; i < GD_SHADOWS; i++) {
        if (shadows[i].batch == batch) return &shadows[i];
        if (!shadows[i].batch && !free_slot) free_slot = &shadows[i];
    }
    if (!make || !free_slot) return NULL;
    free_slot->batch = batch;
    free_slot->n = free_slot->lost = 0;
    free_slot->embd_only = 1;
    return free_slot;
}

static int shadow_grow(gd_shadow *sh, int32_t need) {
    if (need <= sh->cap) return 1;
    int32_t cap = sh->cap ? sh->cap : 512;
    while (cap < need) cap *= 2;
    int32_t *token = realloc(sh->token, cap * sizeof *token);  if (token) sh->token = token;
    int32_t *pos = realloc(sh->pos, cap * sizeof *pos);        if (pos) sh->pos = pos;
    int32_t *n_seq = realloc(sh->n_seq, cap * sizeof *n_seq);  if (n_seq) sh->n_seq = n_seq;
    int32_t *seq = realloc(sh->seq, (size_t)cap * GD_SEQ * sizeof *seq); if (seq) sh->seq = seq;
    int32_t **rows = realloc(sh->seq_row, cap * sizeof *rows); if (rows) sh->seq_row = rows;
    int8_t *out = realloc(sh->out, cap * sizeof *out);         if (out) sh->out = out;
    if (!token || !pos || !n_seq || !seq || !rows || !out) return 0;
    sh->cap = cap;
    return 1;
}

/* A token the real add accepted at idx (its return): appended to the shadow. */
static void shadow_add(const void *batch, int32_t idx, int32_t seq_id, int32_t token, int embd) {
    pthread_mutex_lock(&shadow_mu);
    gd_shadow *sh = shadow_of(batch, 1);
    if (sh && idx >= 0) {
        if (idx != sh->n || !shadow_grow(sh, idx + 1)) sh->lost = 1;
        else {
            sh->token[idx] = token; sh->pos[idx] = 0; sh->out[idx] = 0;   /* llama_batch_ext's defaults */
            sh->n_seq[idx] = 1; sh->seq[(size_t)idx * GD_SEQ] = seq_id;
            sh->embd_only &= embd;
            sh->n = idx + 1;
        }
    }
    pthread_mutex_unlock(&shadow_mu);
}

enum { SET_POS, SET_OUT, ADD_SEQ };
static void shadow_set(const void *batch, int what, int32_t idx, int32_t value) {
    pthread_mutex_lock(&shadow_mu);
    gd_shadow *sh = shadow_of(batch, 0);
    if (sh && idx >= 0 && idx < sh->n) {
        if (what == SET_POS) sh->pos[idx] = value;
        else if (what == SET_OUT) sh->out[idx] = (int8_t)(value != 0);
        else if (sh->n_seq[idx] < GD_SEQ) sh->seq[(size_t)idx * GD_SEQ + sh->n_seq[idx]++] = value;
        else sh->lost = 1;
    }
    pthread_mutex_unlock(&shadow_mu);
}

static void shadow_clear(const void *batch, int release) {
    pthread_mutex_lock(&shadow_mu);
    gd_shadow *sh = shadow_of(batch, !release);
    if (sh) {
        sh->n = sh->lost = 0;
        sh->embd_only = 1;
        if (release) sh->batch = NULL;
    }
    pthread_mutex_unlock(&shadow_mu);
}

typedef struct gd_llama_embd { const float *data; size_t n_rows, n_embd; } gd_llama_embd;
typedef int32_t (*add_fn)(void *, int32_t);
typedef int32_t (*add_token_fn)(void *, int32_t, int32_t);
typedef int32_t (*add_embd_fn)(void *, int32_t, gd_llama_embd);
typedef _Bool (*idx_seq_fn)(void *, int32_t, int32_t);
typedef _Bool (*set_pos_fn)(void *, int32_t, const int32_t *);
typedef _Bool (*set_bool_fn)(void *, int32_t, _Bool);
typedef void (*batch_fn)(void *);
typedef int32_t (*process_fn)(void *, int32_t, void *);

EXPORT void llama_batch_ext_clear(void *batch) {
    REAL(batch_fn, llama_batch_ext_clear)
    if (fn_llama_batch_ext_clear) fn_llama_batch_ext_clear(batch);
    shadow_clear(batch, 0);
}

EXPORT void llama_batch_ext_free(void *batch) {
    REAL(batch_fn, llama_batch_ext_free)
    shadow_clear(batch, 1);
    if (fn_llama_batch_ext_free) fn_llama_batch_ext_free(batch);
}

EXPORT int32_t llama_batch_ext_add(void *batch, int32_t seq_id) {
    REAL(add_fn, llama_batch_ext_add)
    int32_t idx = fn_llama_batch_ext_add ? fn_llama_batch_ext_add(batch, seq_id) : -1;
    shadow_add(batch, idx, seq_id, -1, 0);
    return idx;
}

EXPORT int32_t llama_batch_ext_add_token(void *batch, int32_t seq_id, int32_t id) {
    REAL(add_token_fn, llama_batch_ext_add_token)
    int32_t idx = fn_llama_batch_ext_add_token ? fn_llama_batch_ext_add_token(batch, seq_id, id) : -1;
    shadow_add(batch, idx, seq_id, id, 0);
    return idx;
}

EXPORT int32_t llama_batch_ext_add_embd(void *batch, int32_t seq_id, gd_llama_embd embd) {
    REAL(add_embd_fn, llama_batch_ext_add_embd)
    int32_t idx = fn_llama_batch_ext_add_embd ? fn_llama_batch_ext_add_embd(batch, seq_id, embd) : -1;
    shadow_add(batch, idx, seq_id, -1, 1);
    return idx;
}

EXPORT _Bool llama_batch_ext_add_seq(void *batch, int32_t idx, int32_t seq_id) {
    REAL(idx_seq_fn, llama_batch_ext_add_seq)
    _Bool ok = fn_llama_batch_ext_add_seq && fn_llama_batch_ext_add_seq(batch, idx, seq_id);
    if (ok) shadow_set(batch, ADD_SEQ, idx, seq_id);
    return ok;
}

EXPORT _Bool llama_batch_ext_set_pos(void *batch, int32_t idx, const int32_t *pos) {
    REAL(set_pos_fn, llama_batch_ext_set_pos)
    _Bool ok = fn_llama_batch_ext_set_pos && fn_llama_batch_ext_set_pos(batch, idx, pos);
    if (ok && pos) shadow_set(batch, SET_POS, idx, pos[0]);    /* M-RoPE: the first section's position */
    return ok;
}

EXPORT _Bool llama_batch_ext_set_output_logits(void *batch, int32_t idx, _Bool value) {
    REAL(set_bool_fn, llama_batch_ext_set_output_logits)
    _Bool ok = fn_llama_batch_ext_set_output_logits && fn_llama_batch_ext_set_output_logits(batch, idx, value);
    if (ok) shadow_set(batch, SET_OUT, idx, value);
    return ok;
}

EXPORT _Bool llama_batch_ext_set_output_embd(void *batch, int32_t idx, _Bool value) {
    REAL(set_bool_fn, llama_batch_ext_set_output_embd)
    _Bool ok = fn_llama_batch_ext_set_output_embd && fn_llama_batch_ext_set_output_embd(batch, idx, value);
    if (ok) shadow_set(batch, SET_OUT, idx, value);
    return ok;
}

#define GD_PROCESS_DECODE 1               /* llama.h's LLAMA_PROCESS_TYPE_DECODE */
EXPORT int32_t llama_process(void *ctx, int32_t type, void *batch) {
    REAL(process_fn, llama_process)
    if (!fn_llama_process) return -1;
    int64_t t0 = now_ns();
    int32_t ret = fn_llama_process(ctx, type, batch);
    int64_t t1 = now_ns();
    if (type != GD_PROCESS_DECODE) return ret;
    gd_llama_batch b = {-1, NULL, NULL, NULL, NULL, NULL, NULL};
    static const float no_embd;
    pthread_mutex_lock(&shadow_mu);
    gd_shadow *sh = shadow_of(batch, 0);
    if (sh && !sh->lost) {
        for (int32_t i = 0; i < sh->n; i++) sh->seq_row[i] = sh->seq + (size_t)i * GD_SEQ;
        b.n_tokens = sh->n;
        if (sh->n && sh->embd_only) b.embd = (float *)&no_embd;
        else b.token = sh->token;
        b.pos = sh->pos; b.n_seq_id = sh->n_seq; b.seq_id = sh->seq_row; b.logits = sh->out;
    }
    write_batch(&b, ctx, t0, t1, ret);     /* under shadow_mu: the shadow is read while it is written */
    pthread_mutex_unlock(&shadow_mu);
    return ret;
}

EXPORT int InitializeInjection(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
    return started;
}

/* ---- graphdiag llama: the library loaded into graphdiag's own process (ctypes) ------------------------------
   No CUDA injection there: graphdiag calls gdtrace_attach itself, before llama.cpp's first CUDA call, with the
   file to write. Each attach starts a new file; CUPTI is subscribed once per process (CUPTI allows one
   subscriber), at the first. gdtrace_detach stops writing (the callbacks stay, returning at once). */
EXPORT int gdtrace_attach(const char *path) {
    /* 1: CUPTI subscribed; 0: not (the file's "error" line says why); -1: the file could not be opened;
       -2: this process is already traced (graphdiag trace: the injection's file is kept) */
    pthread_once(&out_once, open_out);
    if (out_from_env) return -2;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    pthread_mutex_lock(&out_mu);
    flush_locked();                           /* the old file's lines to the old file */
    int old = out_fd;
    out_fd = fd;
    pthread_mutex_unlock(&out_mu);
    if (old >= 0) close(old);
    return InitializeInjection();
}

EXPORT void gdtrace_flush(void) {       /* every buffered line written (graphdiag llama: before it reads) */
    pthread_mutex_lock(&out_mu);
    flush_locked();
    pthread_mutex_unlock(&out_mu);
}

EXPORT void gdtrace_detach(void) {
    pthread_mutex_lock(&out_mu);
    flush_locked();
    int old = out_fd;
    out_fd = -1;
    pthread_mutex_unlock(&out_mu);
    if (old >= 0) close(old);
}

EXPORT int64_t gdtrace_own_ns(void) { return __atomic_load_n(&own_ns, __ATOMIC_RELAXED); }
