/* Minimal NVTX v3 injection library for tests: logs domains, registered strings, categories, ranges and
 * marks (with INT64 payloads) to $NVTX_LOG, one line each. Built by test_nvtx_injection.py with gcc. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <nvtx3/nvToolsExt.h>

static FILE *out;
#define MAXS 4096
static const char *strs[MAXS]; static size_t nstrs = 1;   /* registered strings; handle = index */
static const char *doms[256];  static size_t ndoms = 1;   /* domains; handle = index (NULL = default) */

static const char *dname(nvtxDomainHandle_t d) { size_t i = (size_t)d; return (i && i < ndoms) ? doms[i] : "NVTX"; }
static const char *msg(const nvtxEventAttributes_t *a) {
  if (!a) return "";
  if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) { size_t i = (size_t)a->message.registered; return i < nstrs ? strs[i] : "?"; }
  if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) return a->message.ascii;
  return "";
}
static void attrs(const char *what, nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  fprintf(out, "%s %s %s|cat=%u", what, dname(d), msg(a), a ? a->category : 0);
  if (a && a->payloadType == NVTX_PAYLOAD_TYPE_INT64) fprintf(out, "|payload=%lld", (long long)a->payload.llValue);
  fprintf(out, "\n"); fflush(out);
}
static nvtxDomainHandle_t DomainCreateA(const char *n) { doms[ndoms] = strdup(n); fprintf(out, "DOMAIN %s\n", n); fflush(out); return (nvtxDomainHandle_t)(uintptr_t)ndoms++; }
static nvtxStringHandle_t RegStrA(nvtxDomainHandle_t d, const char *s) {
  if (nstrs >= MAXS) return 0;
  strs[nstrs] = strdup(s); fprintf(out, "STRING %s %s\n", dname(d), s); fflush(out);
  return (nvtxStringHandle_t)(uintptr_t)nstrs++; }
static void NameCatA(nvtxDomainHandle_t d, uint32_t c, const char *n) { fprintf(out, "CATEGORY %s %u %s\n", dname(d), c, n); fflush(out); }
static void MarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { attrs("MARK", d, a); }
static int PushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { attrs("PUSH", d, a); return 0; }
static int Pop(nvtxDomainHandle_t d) { fprintf(out, "POP %s\n", dname(d)); fflush(out); return 0; }

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const char *p = getenv("NVTX_LOG"); out = p ? fopen(p, "w") : stderr; if (!out) out = stderr;
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable t = 0; unsigned int n = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) return 0;
  *t[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)DomainCreateA;
  *t[NVTX_CBID_CORE2_DomainRegisterStringA] = (NvtxFunctionPointer)RegStrA;
  *t[NVTX_CBID_CORE2_DomainNameCategoryA] = (NvtxFunctionPointer)NameCatA;
  *t[NVTX_CBID_CORE2_DomainMarkEx] = (NvtxFunctionPointer)MarkEx;
  *t[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)PushEx;
  *t[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)Pop;
  return 1;
}
