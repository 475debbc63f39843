// The C++ part of the virtual `spyre` device: only what PyTorch requires to be C++.
//
//  * an allocator over host memory, aligned to 128-byte sticks, that accounts bytes per card
//    against each card's capacity (from the hardware config) and raises torch.OutOfMemoryError;
//  * the device guard (current card per thread, synchronous streams, host-timed events);
//  * the PrivateUse1 hooks interface and a per-card random generator;
//  * the handful of backend kernels PyTorch needs before anything else works: empty, copies,
//    the backend view ops, resize_/set_, fill_ and _local_scalar_dense.
//
// Every other ATen op reaches the Python host fallback (vspyre/device/fallback.py).

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Generator.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>
#include <vector>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <unordered_map>
#include <sys/mman.h>

namespace vspyre {

// The stick size: set from Python (the active hardware config's stick_bytes), never retyped here.
std::atomic<size_t> g_stick_bytes{0};
constexpr int kMaxCards = 64;
constexpr c10::DeviceType kSpyre = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------------------------------
// Cards: count, current card per thread
// ------------------------------------------------------------------------------------------

static std::atomic<int> g_num_cards{1};
static thread_local c10::DeviceIndex t_current = 0;

static void check_index(c10::DeviceIndex idx) {
  TORCH_CHECK(idx >= 0 && idx < g_num_cards.load(),
              "spyre: invalid device index ", static_cast<int>(idx), " (this process has ",
              g_num_cards.load(), " card(s); set VSPYRE_NUM_CARDS for more)");
}

static c10::DeviceIndex current_index() { return t_current; }

// ------------------------------------------------------------------------------------------
// Allocator
// ------------------------------------------------------------------------------------------

struct CardStats {
  int64_t capacity = 0;
  int64_t allocated = 0;       // bytes currently allocated (rounded to sticks)
  int64_t peak = 0;
  int64_t requested = 0;       // bytes currently requested (before rounding)
  int64_t requested_peak = 0;
  int64_t total_allocated = 0; // bytes ever allocated
  int64_t total_freed = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t live_blocks = 0;
  int64_t live_blocks_peak = 0;
  int64_t num_ooms = 0;
  int64_t num_host_failures = 0;
};

struct Block {
  size_t rounded;
  size_t requested;
  c10::DeviceIndex device;
  bool phantom;   // estimate-only: address space reserved, no host pages, no values
};

// Estimate-only mode (vspyre.device.estimate_only): allocations are accounted against the card's
// capacity exactly as usual but backed by reserved address space with no access (mmap PROT_NONE,
// no pages), so an 8B model costs no host memory. Such memory has no values: every door to its
// bytes (host_view, copies to the host, fills) checks and raises or skips.
std::atomic<bool> g_estimate_only{false};
// Live blocks without values: while there are none (every functional run), the per-access check
// is one atomic load instead of a locked lookup.
std::atomic<int64_t> g_phantom_blocks{0};

static std::string fmt_bytes(int64_t b) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (b >= (int64_t(1) << 30)) os << double(b) / double(int64_t(1) << 30) << " GiB";
  else if (b >= (int64_t(1) << 20)) os << double(b) / double(int64_t(1) << 20) << " MiB";
  else if (b >= (int64_t(1) << 10)) os << double(b) / double(int64_t(1) << 10) << " KiB";
  else os << b << " bytes";
  return os.str();
}

// A c10::DeviceAllocator, so torch.accelerator's memory calls (empty_cache, memory stats,
// get_memory_info) work for the card as for CUDA. There is no cache: a freed block goes back at
// once, so empty_cache has nothing to do and reserved equals allocated.
class SpyreAllocator final : public c10::DeviceAllocator {
 public:
  SpyreAllocator() : stats_(kMaxCards) {}

  c10::DataPtr allocate(size_t nbytes) override { return allocate_as(nbytes, g_estimate_only.load()); }

  c10::DataPtr allocate_as(size_t nbytes, bool phantom) {
    c10::DeviceIndex dev = current_index();
    check_index(dev);
    c10::Device device(kSpyre, dev);
    if (nbytes == 0) {
      return {nullptr, nullptr, &SpyreAllocator::deleter, device};
    }
    const size_t stick = g_stick_bytes.load();
    TORCH_CHECK(stick != 0, "spyre: the stick size was not set (import vspyre)");
    size_t rounded = (nbytes + stick - 1) / stick * stick;
    {
      std::lock_guard<std::mutex> lock(mu_);
      CardStats& s = stats_[dev];
      if (s.allocated + static_cast<int64_t>(rounded) > s.capacity) {
        s.num_ooms++;
        int64_t free_b = s.capacity - s.allocated;
        TORCH_CHECK_WITH(OutOfMemoryError, false,
            "spyre out of memory. Tried to allocate ", fmt_bytes(int64_t(rounded)),
            ". spyre:", int(dev), " has a total capacity of ", fmt_bytes(s.capacity),
            " of which ", fmt_bytes(free_b), " is free. Of the allocated memory ",
            fmt_bytes(s.allocated), " is allocated by PyTorch tensors on this card. "
            "The capacity comes from the hardware config (device_memory_bytes - ecc_bytes).");
      }
      // Reserve before the host allocation so concurrent allocations cannot overshoot.
      s.allocated += rounded;
    }
    void* ptr = nullptr;
    if (phantom) {
      void* m = mmap(nullptr, rounded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      ptr = m == MAP_FAILED ? nullptr : m;
    } else {
      ptr = std::aligned_alloc(stick, rounded);
    }
    if (ptr == nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      CardStats& s = stats_[dev];
      s.allocated -= rounded;
      s.num_host_failures++;
      TORCH_CHECK_WITH(OutOfMemoryError, false,
          "spyre: the host could not back an allocation of ", fmt_bytes(int64_t(rounded)),
          " for spyre:", int(dev), " (device memory is simulated in host RAM and the host ran "
          "out before the card's capacity of ", fmt_bytes(s.capacity), " was reached).");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      CardStats& s = stats_[dev];
      s.peak = std::max(s.peak, s.allocated);
      s.requested += nbytes;
      s.requested_peak = std::max(s.requested_peak, s.requested);
      s.total_allocated += rounded;
      s.num_allocs++;
      s.live_blocks++;
      s.live_blocks_peak = std::max(s.live_blocks_peak, s.live_blocks);
      blocks_[ptr] = Block{rounded, nbytes, dev, phantom};
      if (phantom) g_phantom_blocks++;
    }
    return {ptr, ptr, &SpyreAllocator::deleter, device};
  }

  static void deleter(void* ptr);

  void release(void* ptr) {
    if (ptr == nullptr) return;
    bool phantom = false;
    size_t rounded = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(ptr);
      TORCH_INTERNAL_ASSERT(it != blocks_.end(), "spyre: freeing an unknown block");
      CardStats& s = stats_[it->second.device];
      s.allocated -= it->second.rounded;
      s.requested -= it->second.requested;
      s.total_freed += it->second.rounded;
      s.num_frees++;
      s.live_blocks--;
      phantom = it->second.phantom;
      rounded = it->second.rounded;
      if (phantom) g_phantom_blocks--;
      blocks_.erase(it);
    }
    if (phantom) munmap(ptr, rounded);
    else std::free(ptr);
  }

  // Whether the block starting at ptr has no values (allocated in estimate-only mode).
  bool is_phantom(const void* ptr) {
    if (ptr == nullptr || g_phantom_blocks.load() == 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(const_cast<void*>(ptr));
    return it != blocks_.end() && it->second.phantom;
  }

  c10::DeleterFnPtr raw_deleter() const override { return &SpyreAllocator::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  c10::DeviceIndex device_of(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(const_cast<void*>(ptr));
    if (it != blocks_.end()) return it->second.device;
    return -1;
  }

  CardStats stats(c10::DeviceIndex dev) {
    check_index(dev);
    std::lock_guard<std::mutex> lock(mu_);
    return stats_[dev];
  }

  void set_capacity(c10::DeviceIndex dev, int64_t bytes) {
    TORCH_CHECK(dev >= 0 && dev < kMaxCards, "spyre: invalid device index ", int(dev));
    TORCH_CHECK(bytes >= 0, "spyre: capacity must be >= 0");
    std::lock_guard<std::mutex> lock(mu_);
    stats_[dev].capacity = bytes;
  }

  void reset_peak(c10::DeviceIndex dev) {
    check_index(dev);
    std::lock_guard<std::mutex> lock(mu_);
    stats_[dev].peak = stats_[dev].allocated;
    stats_[dev].requested_peak = stats_[dev].requested;
    stats_[dev].live_blocks_peak = stats_[dev].live_blocks;
  }

  // -- c10::DeviceAllocator ---------------------------------------------------------------
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex dev) override {
    CardStats s = stats(dev);
    c10::CachingDeviceAllocator::DeviceStats out;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& a, int64_t cur, int64_t peak, int64_t in, int64_t freed) {
      auto& st = a[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      st.current = cur;
      st.peak = peak;
      st.allocated = in;
      st.freed = freed;
    };
    fill(out.allocated_bytes, s.allocated, s.peak, s.total_allocated, s.total_freed);
    fill(out.reserved_bytes, s.allocated, s.peak, s.total_allocated, s.total_freed);
    fill(out.active_bytes, s.allocated, s.peak, s.total_allocated, s.total_freed);
    fill(out.requested_bytes, s.requested, s.requested_peak, s.total_allocated, s.total_freed);
    fill(out.allocation, s.live_blocks, s.live_blocks_peak, s.num_allocs, s.num_frees);
    fill(out.segment, s.live_blocks, s.live_blocks_peak, s.num_allocs, s.num_frees);
    fill(out.active, s.live_blocks, s.live_blocks_peak, s.num_allocs, s.num_frees);
    out.num_device_alloc = s.num_allocs;
    out.num_device_free = s.num_frees;
    out.num_ooms = s.num_ooms;
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex dev) override { reset_accumulated(dev); }
  void resetPeakStats(c10::DeviceIndex dev) override { reset_peak(dev); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex dev) override {
    CardStats s = stats(dev);
    return {static_cast<size_t>(std::max<int64_t>(0, s.capacity - s.allocated)), static_cast<size_t>(s.capacity)};
  }

  void reset_accumulated(c10::DeviceIndex dev) {
    check_index(dev);
    std::lock_guard<std::mutex> lock(mu_);
    CardStats& s = stats_[dev];
    s.total_allocated = s.total_freed = s.num_allocs = s.num_frees = 0;
    s.num_ooms = s.num_host_failures = 0;
  }

 private:
  std::mutex mu_;
  std::vector<CardStats> stats_;
  std::unordered_map<void*, Block> blocks_;
};

static SpyreAllocator g_allocator;
void SpyreAllocator::deleter(void* ptr) { g_allocator.release(ptr); }

REGISTER_ALLOCATOR(kSpyre, &g_allocator);

// The card's host allocator (torch.accelerator's host-cache calls, e.g. empty_host_cache, which
// vLLM makes at shutdown, look it up for the accelerator). Host memory of a virtual card needs no
// pinning: blocks are plain aligned host memory, freed at once, so there is no cache to empty.
class SpyreHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? std::aligned_alloc(128, (nbytes + 127) / 128 * 128) : nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, nbytes == 0 || p != nullptr, "spyre: host allocation of ", nbytes,
                     " bytes failed");
    return {p, p, &SpyreHostAllocator::deleter, c10::Device(c10::DeviceType::CPU)};
  }
  static void deleter(void* p) { std::free(p); }
  c10::DeleterFnPtr raw_deleter() const override { return &SpyreHostAllocator::deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

static SpyreHostAllocator g_host_allocator;
REGISTER_HOST_ALLOCATOR(kSpyre, &g_host_allocator);

// ------------------------------------------------------------------------------------------
// Device guard: synchronous streams (one per card), events stamped with host time
// ------------------------------------------------------------------------------------------

struct HostEvent {
  std::chrono::steady_clock::time_point when;
  bool recorded = false;
};

struct SpyreGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kSpyre; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kSpyre);
    c10::Device old(kSpyre, t_current);
    if (d.index() >= 0) {
      check_index(d.index());
      t_current = d.index();
    }
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kSpyre, t_current); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kSpyre);
    if (d.index() >= 0) {
      check_index(d.index());
      t_current = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    (void)priority;
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority = false) const override {
    (void)high_priority;
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_num_cards.load());
  }
  // Every kernel completes before its launch returns, so streams and events are always done.
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void synchronizeEvent(void*) const override {}
  bool queryEvent(void*) const override { return true; }
  void block(void*, const c10::Stream&) const override {}
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    (void)stream; (void)device_index; (void)flag;
    if (*event == nullptr) *event = new HostEvent();
    auto* ev = static_cast<HostEvent*>(*event);
    ev->when = std::chrono::steady_clock::now();
    ev->recorded = true;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<HostEvent*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<HostEvent*>(start);
    auto* b = static_cast<HostEvent*>(end);
    TORCH_CHECK(a && b && a->recorded && b->recorded,
                "spyre: both events must be recorded before elapsed_time()");
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, SpyreGuardImpl);

// ------------------------------------------------------------------------------------------
// Random generators: a CPU (Philox-free, mt19937) generator per card, tagged with the card
// ------------------------------------------------------------------------------------------

struct SpyreGenerator final : public at::CPUGeneratorImpl {
  explicit SpyreGenerator(c10::DeviceIndex idx, uint64_t seed = c10::default_rng_seed_val)
      : at::CPUGeneratorImpl(seed) {
    device_ = c10::Device(kSpyre, idx);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
  SpyreGenerator* clone_impl() const override {
    auto gen = new SpyreGenerator(device_.index());
    gen->set_state(*this->get_state());
    return gen;
  }
};

static at::Generator make_generator(c10::DeviceIndex idx) {
  return at::make_generator<SpyreGenerator>(idx < 0 ? current_index() : idx);
}

static const at::Generator& default_generator(c10::DeviceIndex idx) {
  static std::once_flag flag;
  static std::vector<at::Generator> gens;
  std::call_once(flag, [] {
    for (int i = 0; i < kMaxCards; ++i) gens.push_back(make_generator(i));
  });
  if (idx < 0) idx = current_index();
  check_index(idx);
  return gens[idx];
}

// ------------------------------------------------------------------------------------------
// Hooks
// ------------------------------------------------------------------------------------------

struct SpyreHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return g_num_cards.load(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { check_index(d); t_current = d; }
  c10::DeviceIndex getCurrentDevice() const override { return t_current; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = t_current;
    check_index(d);
    t_current = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex idx) const override {
    return default_generator(idx);
  }
  at::Generator getNewGenerator(c10::DeviceIndex idx) const override { return make_generator(idx); }
  c10::Device getDeviceFromPtr(void* data) const override {
    auto d = g_allocator.device_of(data);
    TORCH_CHECK(d >= 0, "spyre: pointer was not allocated on a spyre card");
    return c10::Device(kSpyre, d);
  }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return at::getCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

static bool register_hooks() {
  at::RegisterPrivateUse1HooksInterface(new SpyreHooks());
  return true;
}
static bool g_hooks_registered = register_hooks();

// ------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------

// The name a Python user knows a dtype by (torch.float64, not "Double").
static std::string torch_dtype_name(c10::ScalarType dt) {
  switch (dt) {
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat: return "torch.float32";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kDouble: return "torch.float64";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kUInt16: return "torch.uint16";
    case at::kUInt32: return "torch.uint32";
    case at::kUInt64: return "torch.uint64";
    default: return std::string("torch.") + c10::toString(dt);
  }
}

// The dtypes the card holds: set once from Python (vspyre.hardware.card_dtypes(), the one list),
// never retyped here.
static std::vector<c10::ScalarType> g_card_dtypes;
static std::mutex g_card_dtypes_mutex;

void set_card_dtypes(const std::vector<c10::ScalarType>& dts) {
  std::lock_guard<std::mutex> lock(g_card_dtypes_mutex);
  g_card_dtypes = dts;
}

static void check_dtype(c10::ScalarType dt, const char* op) {
  std::lock_guard<std::mutex> lock(g_card_dtypes_mutex);
  TORCH_CHECK(!g_card_dtypes.empty(), "spyre: ", op, ": the card's dtypes were not set (import vspyre)");
  for (auto d : g_card_dtypes)
    if (d == dt) return;
  std::string names;
  for (auto d : g_card_dtypes) {
    if (!names.empty()) names += ", ";
    names += torch_dtype_name(d).substr(6);   // drop "torch."
  }
  TORCH_CHECK_TYPE(false, "spyre: ", op, ": dtype ", torch_dtype_name(dt),
      " is not supported by the card (supported: ", names,
      "). Convert on the host first, e.g. t.to(torch.float32).");
}

// A CPU tensor over the same bytes as a spyre tensor: same storage span, offset, sizes,
// strides. The CPU tensor keeps the device storage alive.
static bool phantom(const at::Tensor& t) {
  return t.device().type() == kSpyre && t.has_storage() && g_allocator.is_phantom(t.storage().data());
}

static void check_values(const at::Tensor& t, const char* what) {
  TORCH_CHECK(!phantom(t), "spyre: ", what, ": this ", torch_dtype_name(t.scalar_type()).substr(6), " tensor of shape ",
      t.sizes(), " has no values: it was produced in estimate-only mode (torch.spyre.estimate_only(), "
      "VSPYRE_ESTIMATE_ONLY=1), where kernels are planned and costed but not executed. Run without that "
      "mode to read values.");
}

at::Tensor host_view(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kSpyre, "host_view expects a spyre tensor, got ", t.device());
  check_values(t, "reading device memory");
  const c10::Storage& st = t.storage();
  auto* keep = new c10::Storage(st);
  void* base = st.mutable_data();
  c10::DataPtr dp(base, keep, [](void* ctx) { delete static_cast<c10::Storage*>(ctx); },
                  c10::Device(c10::kCPU));
  c10::Storage cpu_storage(c10::Storage::use_byte_size_t(), st.nbytes(), std::move(dp),
                           /*allocator=*/nullptr, /*resizable=*/false);
  auto out = at::empty({0}, t.options().device(c10::kCPU));
  out.set_(cpu_storage, t.storage_offset(), t.sizes(), t.strides());
  return out;
}

static at::Tensor host_or_self(const at::Tensor& t) {
  return t.device().type() == kSpyre ? host_view(t) : t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  auto dt = c10::dtype_or_default(dtype);
  check_dtype(dt, "empty");
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dt, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  auto dt = c10::dtype_or_default(dtype);
  check_dtype(dt, "empty_strided");
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dt);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  (void)non_blocking;  // every copy is synchronous on the virtual card
  if (dst.device().type() == kSpyre) check_dtype(dst.scalar_type(), "copy_");
  if (phantom(dst)) return dst;             // estimate-only: nothing to write, no values to keep
  check_values(self, dst.device().type() == kSpyre ? "copy_ (into a tensor with values)" : "copy_ (to the host)");
  if (self.device().type() == kSpyre && dst.device().type() != kSpyre &&
      dst.device().type() != c10::kCPU) {
    TORCH_CHECK(false, "spyre: copy to ", dst.device(), " is not supported (copy through cpu)");
  }
  auto src_h = host_or_self(self);
  auto dst_h = host_or_self(dst);
  dst_h.copy_(src_h);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// Grow (or keep) a spyre storage to `newsize` bytes, keeping its contents.
void resize_bytes(c10::StorageImpl* storage, size_t newsize) {
  if (newsize <= storage->nbytes() && storage->data() != nullptr) return;
  TORCH_CHECK(storage->resizable(), "spyre: trying to resize storage that is not resizable");
  c10::DeviceGuard guard(storage->device());
  const bool was_phantom = g_allocator.is_phantom(storage->data());
  const bool to_phantom = was_phantom || g_estimate_only.load();   // no values in, or none kept
  c10::DataPtr fresh = g_allocator.allocate_as(newsize, to_phantom);
  size_t keep = std::min(newsize, storage->nbytes());
  if (keep > 0 && storage->data() != nullptr && !to_phantom) std::memcpy(fresh.get(), storage->data(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(newsize);
}

void SpyreHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_bytes(storage.unsafeGetStorageImpl(), newsize);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  int64_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(),
                                                    self.dtype().itemsize(), self.storage_offset());
  if (self.numel() > 0) resize_bytes(self.storage().unsafeGetStorageImpl(), static_cast<size_t>(needed));
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device_type() == kSpyre, "spyre: set_ expects a spyre storage, got ",
              source.device());
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty() && !size.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  int64_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(),
                                                    self.dtype().itemsize(), offset);
  if (self.numel() > 0 && static_cast<size_t>(needed) > self.storage().nbytes()) {
    resize_bytes(self.storage().unsafeGetStorageImpl(), static_cast<size_t>(needed));
  }
  return self;
}

at::Tensor& set_storage_full(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return self;
  return set_storage(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, g_allocator.allocate(0), &g_allocator, true);
  return set_storage(self, std::move(st), 0, {0}, {});
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (phantom(self)) return self;
  host_view(self).fill_(value);
  return self;
}

at::Tensor& zero_(at::Tensor& self) {
  if (phantom(self)) return self;
  host_view(self).zero_();
  return self;
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  check_values(self, "item() (a data-dependent read, e.g. control flow on a value)");
  return host_view(self).item();
}

// -- attention: scaled_dot_product_attention picks its backend through this stub per device type.
// The card runs attention as one flash program, reached through the op PyTorch keeps for
// out-of-tree backends (_scaled_dot_product_fused_attention_overrideable): compiled graphs keep it
// as one node (the Inductor extension and the standalone compiler lower it to the card's flash
// program), eager calls run it as one op. Dropout and non-4-D inputs take the math path.
std::atomic<bool> g_fused_attention{true};

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  auto ok_dtype = [](const at::Tensor& t) {
    auto d = t.scalar_type();
    return d == at::kHalf || d == at::kBFloat16 || d == at::kFloat;
  };
  if (!g_fused_attention.load() || dropout_p > 0.0 || q.dim() != 4 || k.dim() != 4 || v.dim() != 4 ||
      q.is_nested() || !ok_dtype(q) || k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    return static_cast<int64_t>(at::SDPBackend::math);
  }
  // sym_size: under torch.compile the sizes may be symbolic; size() would specialise all of them
  // (the KV length of a decode step with it), sym_size guards only on the head counts it reads.
  const c10::SymInt hq = q.sym_size(1), hk = k.sym_size(1), hv = v.sym_size(1);
  if (hk != hv || (hk != hq && (hk == 0 || hq % hk != 0))) {
    return static_cast<int64_t>(at::SDPBackend::math);
  }
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

}  // namespace vspyre

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &vspyre::fused_sdp_choice)
}  // namespace at::native

namespace vspyre {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_storage_full);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("zero_", zero_);
  m.impl("_local_scalar_dense", local_scalar_dense);
}

// ------------------------------------------------------------------------------------------
// Python bindings (private: the public API is vspyre.device / torch.spyre)
// ------------------------------------------------------------------------------------------

static py::dict stats_dict(c10::DeviceIndex dev) {
  CardStats s = g_allocator.stats(dev);
  py::dict d;
  d["capacity"] = s.capacity;
  d["allocated_bytes.all.current"] = s.allocated;
  d["allocated_bytes.all.peak"] = s.peak;
  d["allocated_bytes.all.allocated"] = s.total_allocated;
  d["allocated_bytes.all.freed"] = s.total_freed;
  d["requested_bytes.all.current"] = s.requested;
  d["requested_bytes.all.peak"] = s.requested_peak;
  d["reserved_bytes.all.current"] = s.allocated;  // no caching: reserved == allocated
  d["reserved_bytes.all.peak"] = s.peak;
  d["allocation.all.current"] = s.live_blocks;
  d["allocation.all.peak"] = s.live_blocks_peak;
  d["allocation.all.allocated"] = s.num_allocs;
  d["allocation.all.freed"] = s.num_frees;
  d["num_ooms"] = s.num_ooms;
  d["num_host_alloc_failures"] = s.num_host_failures;
  return d;
}

}  // namespace vspyre

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {   // _C_<torch release>, set by setup.py
  m.doc() = "C++ part of the virtual spyre device (allocator, guard, hooks, core kernels)";
  m.def("_set_num_cards", [](int n) {
    TORCH_CHECK(n >= 1 && n <= vspyre::kMaxCards, "spyre: num_cards must be in 1..",
                vspyre::kMaxCards, ", got ", n);
    vspyre::g_num_cards = n;
  });
  m.def("_num_cards", [] { return vspyre::g_num_cards.load(); });
  m.def("_set_fused_attention", [](bool on) { return vspyre::g_fused_attention.exchange(on); },
        "whether scaled_dot_product_attention on the card takes the fused (flash) path; returns the old value");
  m.def("_set_stick_bytes", [](int64_t n) {
    TORCH_CHECK(n > 0 && (n & (n - 1)) == 0, "spyre: stick_bytes must be a power of two, got ", n);
    vspyre::g_stick_bytes.store(static_cast<size_t>(n));
  });
  m.def("_set_card_dtypes", &vspyre::set_card_dtypes, "the dtypes the card holds (vspyre.hardware.card_dtypes())");
  m.def("_set_capacity", [](int dev, int64_t bytes) { vspyre::g_allocator.set_capacity(dev, bytes); });
  m.def("_memory_stats", [](int dev) { return vspyre::stats_dict(dev); });
  m.def("_reset_peak", [](int dev) { vspyre::g_allocator.reset_peak(dev); });
  m.def("_reset_accumulated", [](int dev) { vspyre::g_allocator.reset_accumulated(dev); });
  m.def("_current_device", [] { return static_cast<int>(vspyre::t_current); });
  m.def("_set_device", [](int dev) {
    vspyre::check_index(dev);
    vspyre::t_current = static_cast<c10::DeviceIndex>(dev);
  });
  m.def("_set_estimate_only", [](bool on) { return vspyre::g_estimate_only.exchange(on); },
        "estimate-only allocations (no host pages, no values); returns the previous setting");
  m.def("_estimate_only", [] { return vspyre::g_estimate_only.load(); });
  m.def("_has_values", [](const at::Tensor& t) { return !vspyre::phantom(t); },
        "false for a spyre tensor allocated in estimate-only mode");
  m.def("_host_view", &vspyre::host_view, "CPU tensor aliasing a spyre tensor's memory");
  m.def("_default_generator", [](int dev) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(vspyre::default_generator(dev)));
  });
  m.def("_hooks_registered", [] { return vspyre::g_hooks_registered; });
}
