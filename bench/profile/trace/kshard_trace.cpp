// kshard_trace: a CUPTI activity tracer that any CUDA program loads without
// being rebuilt, through the driver's injection hook:
//
//   CUDA_INJECTION64_PATH=libkshard_trace.so KSHARD_TRACE_OUT=run.tsv <program>
//
// It records, with the GPU's own timestamps, every kernel, memcpy and memset
// (start, end, stream) and every CUDA runtime/driver call and host-side
// synchronization (start, end, thread), and writes them as one tab-separated
// file when the program exits (bench/profile/timeline.py reads it).
//
// Why not ncu: ncu serializes kernels and replays them, so it measures each
// kernel alone but cannot see the time the GPU waits for the host, and one
// step of a large model under it takes minutes. Nsight Systems, which would,
// is not usable on the GPU machine (its report step fails there). CUPTI's
// activity API is what both are built on; it ships with the CUDA toolkit.
// The same library traces kshard-train and the PyTorch twin, so both sides
// of a comparison are measured by one tool.
//
// Overhead: CUPTI timestamps in its own buffers; the records are decoded when
// a buffer is handed back (on CUPTI's thread) and written at exit.
#include <cupti.h>

#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kBufferBytes = 8u << 20;

struct Tracer {
  std::mutex mu;
  std::string out;  // the file's lines, written at exit
  std::string path;
  std::size_t records = 0;
  std::size_t dropped = 0;
};

Tracer& tracer() {
  static Tracer* t = new Tracer;  // leaked on purpose: used from atexit and CUPTI's thread
  return *t;
}

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                           std::free);
  std::string s = (status == 0 && d) ? d.get() : name;
  for (char& c : s)
    if (c == '\t' || c == '\n') c = ' ';
  return s;
}

const char* api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* n = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &n) != CUPTI_SUCCESS || !n) return "?";
  return n;
}

const char* sync_name(CUpti_ActivitySynchronizationType t) {
  switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "cudaEventSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "cudaStreamWaitEvent";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "cudaStreamSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "cudaDeviceSynchronize";
    default: return "sync";
  }
}

const char* copy_kind(std::uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

// One line: kind, start ns, end ns, stream (GPU) or thread (host), correlation
// id, bytes (copies, sets; else 0), name.
void line(std::string& o, const char* kind, std::uint64_t start, std::uint64_t end,
          std::uint64_t where, std::uint32_t corr, std::uint64_t bytes, const std::string& name) {
  char head[160];
  std::snprintf(head, sizeof head, "%s\t%llu\t%llu\t%llu\t%u\t%llu\t", kind,
                static_cast<unsigned long long>(start), static_cast<unsigned long long>(end),
                static_cast<unsigned long long>(where), corr,
                static_cast<unsigned long long>(bytes));
  o += head;
  o += name;
  o += '\n';
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  std::string o;
  std::size_t n = 0;
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    ++n;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        line(o, "kernel", k->start, k->end, k->streamId, k->correlationId, 0, demangle(k->name));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        line(o, "memcpy", m->start, m->end, m->streamId, m->correlationId, m->bytes,
             copy_kind(m->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        line(o, "memset", m->start, m->end, m->streamId, m->correlationId, m->bytes, "memset");
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        const bool rt = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        line(o, rt ? "runtime" : "driver", a->start, a->end, a->threadId, a->correlationId, 0,
             api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid));
        break;
      }
      case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        auto* s = reinterpret_cast<CUpti_ActivitySynchronization2*>(rec);
        line(o, "sync", s->start, s->end, s->streamId, s->correlationId, 0, sync_name(s->type));
        break;
      }
      default:
        break;
    }
  }
  std::size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  std::free(buffer);
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  t.out += o;
  t.records += n;
  t.dropped += dropped;
}

void write_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  std::FILE* f = std::fopen(t.path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kshard_trace: cannot write %s\n", t.path.c_str());
    return;
  }
  std::fputs("kind\tstart_ns\tend_ns\twhere\tcorrelation\tbytes\tname\n", f);
  std::fwrite(t.out.data(), 1, t.out.size(), f);
  std::fclose(f);
  std::fprintf(stderr, "kshard_trace: %zu records (%zu dropped) -> %s\n", t.records, t.dropped,
               t.path.c_str());
}

bool enable(CUpti_ActivityKind kind, const char* what) {
  const CUptiResult r = cuptiActivityEnable(kind);
  if (r == CUPTI_SUCCESS) return true;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "kshard_trace: cannot trace %s: %s\n", what, s ? s : "?");
  return false;
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  Tracer& t = tracer();
  const char* p = std::getenv("KSHARD_TRACE_OUT");
  std::string path = p && *p ? p : "kshard-trace.tsv";
  // Several ranks of one launch would write the same file: the name gets the
  // process id where it holds "%p".
  if (const auto at = path.find("%p"); at != std::string::npos)
    path.replace(at, 2, std::to_string(::getpid()));
  t.path = path;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kshard_trace: cuptiActivityRegisterCallbacks failed; not tracing\n");
    return 1;
  }
  enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "kernels");
  enable(CUPTI_ACTIVITY_KIND_MEMCPY, "memcpys");
  enable(CUPTI_ACTIVITY_KIND_MEMSET, "memsets");
  enable(CUPTI_ACTIVITY_KIND_RUNTIME, "runtime API calls");
  enable(CUPTI_ACTIVITY_KIND_DRIVER, "driver API calls");
  enable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "synchronizations");
  std::atexit(write_at_exit);
  std::fprintf(stderr, "kshard_trace: tracing to %s\n", t.path.c_str());
  return 1;
}
