// The native guard: kforge's kernels put in front of an aten op at the dispatcher, in C++.
//
// One route per (op, dispatch key) holds the kernels of exact variants, each a resolved launch
// plan (constants only; see kforge/core/launch_plan.py). A call whose arguments match a variant
// exactly (dtypes, shapes, strides, storage offsets, devices, scalar values) allocates the plan's
// outputs and scratch and launches its kernels through cuLaunchKernel on PyTorch's current
// stream; every other call, and every call of a variant whose kernel failed, runs the op's own
// kernel. No Python runs on either path: a miss costs the comparison, a hit costs less than the
// op's own kernel does to launch.
//
// Python (kforge/runtime/native.py) describes variants as flat int64 arrays and drives this file
// through a C interface; it never passes candidate code, only constants.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

// The argument kinds a variant can expect, in the order kforge/runtime/native.py numbers them.
enum Kind : int64_t {
  kNone = 0,          // an optional argument left None
  kTensor = 1,        // a strided tensor: dtype, device, sizes, strides, storage offset
  kInt = 2,           // an int (or SymInt, or a Scalar holding an int)
  kDouble = 3,        // a float, compared bit for bit
  kBool = 4,
  kIntList = 5,
  kTensorList = 6,
  kWrappedInt = 7,    // a Python int where the schema wants a Tensor (x * 2)
  kWrappedDouble = 8, // a Python float there (x * 0.125)
  kWrappedBool = 9,
};

enum Source : int64_t { kScalarParam = 0, kArgPointer = 1, kOutputPointer = 2, kScratchPointer = 3 };
enum Returns : int64_t { kSingle = 0, kTuple = 1, kList = 2 };

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);

LaunchFn driver_launch() {
  static LaunchFn launch = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    return driver ? reinterpret_cast<LaunchFn>(dlsym(driver, "cuLaunchKernel")) : nullptr;
  }();
  return launch;
}

struct TensorExpect {
  c10::ScalarType dtype;
  c10::Device device{c10::kCPU};
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;

  bool matches(const at::Tensor& t) const {
    if (!t.defined() || t.layout() != c10::kStrided || t.scalar_type() != dtype ||
        t.device() != device || t.is_conj() || t.is_neg() ||
        t.unsafeGetTensorImpl()->is_wrapped_number()) {
      return false;
    }
    const auto s = t.sizes();
    const auto st = t.strides();
    return s.size() == sizes.size() &&
           std::memcmp(s.data(), sizes.data(), sizes.size() * sizeof(int64_t)) == 0 &&
           std::memcmp(st.data(), strides.data(), strides.size() * sizeof(int64_t)) == 0 &&
           t.storage_offset() == offset;
  }
};

struct ArgExpect {
  Kind kind = kNone;
  int64_t value = 0;  // kInt, kBool, kWrapped*: the value; kDouble: its bits
  std::vector<int64_t> ints;
  std::vector<TensorExpect> tensors;  // one for kTensor; the items for kTensorList

  bool matches(const c10::IValue& v) const {
    switch (kind) {
      case kNone:
        return v.isNone();
      case kTensor:
        return v.isTensor() && tensors[0].matches(v.toTensor());
      case kInt:
        return v.isInt() && v.toInt() == value;
      case kBool:
        return v.isBool() && v.toBool() == static_cast<bool>(value);
      case kDouble: {
        if (!v.isDouble()) return false;
        const double d = v.toDouble();
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        return bits == value;
      }
      case kIntList: {
        if (!v.isIntList()) return false;
        const auto list = v.toIntList();
        if (list.size() != ints.size()) return false;
        for (size_t i = 0; i < ints.size(); ++i) {
          if (list.get(i) != ints[i]) return false;
        }
        return true;
      }
      case kTensorList: {
        if (!v.isTensorList()) return false;
        const auto list = v.toTensorList();
        if (list.size() != tensors.size()) return false;
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (!tensors[i].matches(list.get(i))) return false;
        }
        return true;
      }
      case kWrappedInt:
      case kWrappedDouble:
      case kWrappedBool:
        return wrapped_matches(v);
    }
    return false;
  }

  bool wrapped_matches(const c10::IValue& v) const {
    if (!v.isTensor()) return false;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number() || t.dim() != 0 ||
        !t.device().is_cpu()) {
      return false;
    }
    switch (kind) {
      case kWrappedInt:
        return t.scalar_type() == c10::kLong && *t.const_data_ptr<int64_t>() == value;
      case kWrappedBool:
        return t.scalar_type() == c10::kBool &&
               *t.const_data_ptr<bool>() == static_cast<bool>(value);
      default: {
        if (t.scalar_type() != c10::kDouble) return false;
        int64_t bits;
        std::memcpy(&bits, t.const_data_ptr<double>(), sizeof bits);
        return bits == value;
      }
    }
  }
};

struct Pointer {
  Source source;
  int64_t position;  // argument position, output index or scratch index
  int64_t item;      // the item of a tensor-list argument, or -1
  int64_t slot;      // which parameter it fills
};

struct Launch {
  void* function = nullptr;
  void* unaligned = nullptr;  // the kernel for pointers that miss `align`, or none
  int64_t align = 0;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  std::vector<uint64_t> values;  // every parameter, 8 bytes apiece; scalars set once
  std::vector<Pointer> pointers;
};

struct Output {
  bool is_arg = false;
  int64_t arg = 0;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes, strides;
};

struct Variant {
  std::string label;
  c10::Device device{c10::kCPU};
  std::vector<ArgExpect> args;
  std::vector<Output> outputs;
  std::vector<std::pair<int64_t, bool>> scratch;  // bytes, zeroed
  std::vector<Launch> launches;
  Returns returns = kSingle;
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> fallbacks{0};
  std::atomic<bool> disabled{false};
  std::mutex reason_lock;
  std::string reason;

  bool matches(const c10::IValue* args_begin, size_t n) const {
    if (n != args.size()) return false;
    for (size_t i = 0; i < n; ++i) {
      if (!args[i].matches(args_begin[i])) return false;
    }
    return true;
  }

  void disable(const std::string& why) {
    {
      std::lock_guard<std::mutex> hold(reason_lock);
      reason = why;
    }
    disabled = true;
    TORCH_WARN("kforge kernel ", label, " failed (", why,
               "); it runs as eager PyTorch from now on");
  }

  // Run the plan on the matched arguments; false (and the variant disabled) when a launch is
  // refused, so that the op's own kernel serves this call.
  bool run(const c10::IValue* argv, std::vector<c10::IValue>& results) {
    LaunchFn launch_fn = driver_launch();
    if (!launch_fn && !launches.empty()) {
      disable("the CUDA driver library libcuda.so.1 cannot be loaded");
      return false;
    }
    c10::OptionalDeviceGuard guard;
    if (device.is_cuda()) guard.reset_device(device);
    std::vector<at::Tensor> fresh(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].is_arg) {
        fresh[i] = at::empty_strided(outputs[i].sizes, outputs[i].strides,
                                     at::TensorOptions().dtype(outputs[i].dtype).device(device));
      }
    }
    std::vector<at::Tensor> buffers;
    buffers.reserve(scratch.size());
    for (const auto& [nbytes, zero] : scratch) {
      auto options = at::TensorOptions().dtype(c10::kByte).device(device);
      const int64_t n = std::max<int64_t>(nbytes, 1);
      buffers.push_back(zero ? at::zeros({n}, options) : at::empty({n}, options));
    }
    if (!launches.empty()) {
      void* stream = c10::impl::getDeviceGuardImpl(device.type())
                         ->getStream(device)
                         .native_handle();
      for (auto& l : launches) {
        uint64_t values[64];
        void* params[64];
        const size_t count = l.values.size();
        std::memcpy(values, l.values.data(), count * sizeof(uint64_t));
        bool aligned = true;
        for (const Pointer& p : l.pointers) {
          const void* address = nullptr;
          if (p.source == kArgPointer) {
            const c10::IValue& v = argv[p.position];
            if (v.isTensor()) {
              address = v.toTensor().const_data_ptr();
            } else if (v.isTensorList()) {
              address = v.toTensorList().get(p.item).const_data_ptr();
            }
          } else if (p.source == kOutputPointer) {
            const Output& o = outputs[p.position];
            address = o.is_arg ? argv[o.arg].toTensor().const_data_ptr()
                               : fresh[p.position].const_data_ptr();
          } else {
            address = buffers[p.position].const_data_ptr();
          }
          const auto bits = reinterpret_cast<uint64_t>(address);
          values[p.slot] = bits;
          if (l.align && bits % static_cast<uint64_t>(l.align)) aligned = false;
        }
        for (size_t i = 0; i < count; ++i) params[i] = &values[i];
        void* function = (!aligned && l.unaligned) ? l.unaligned : l.function;
        const int err = launch_fn(function, l.grid[0], l.grid[1], l.grid[2], l.block[0],
                                  l.block[1], l.block[2], l.shared_mem, stream, params, nullptr);
        if (err) {
          disable("cuLaunchKernel failed with CUresult " + std::to_string(err));
          return false;
        }
      }
    }
    std::vector<at::Tensor> out(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      out[i] = outputs[i].is_arg ? argv[outputs[i].arg].toTensor() : std::move(fresh[i]);
    }
    if (returns == kList) {
      results.emplace_back(c10::List<at::Tensor>(out));
    } else {
      for (auto& t : out) results.emplace_back(std::move(t));
    }
    return true;
  }
};

struct RouteState {
  std::shared_ptr<const std::vector<std::shared_ptr<Variant>>> variants =
      std::make_shared<const std::vector<std::shared_ptr<Variant>>>();
  std::atomic<int64_t> misses{0};
};

class GuardKernel final : public c10::OperatorKernel {
 public:
  GuardKernel(std::shared_ptr<RouteState> state, c10::SafeKernelFunction original)
      : state_(std::move(state)), original_(std::move(original)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const c10::IValue* argv = stack->data() + (stack->size() - n);
    const auto variants = std::atomic_load(&state_->variants);
    for (const auto& variant : *variants) {
      if (!variant->matches(argv, n)) continue;
      if (!variant->disabled) {
        std::vector<c10::IValue> results;
        if (variant->run(argv, results)) {
          torch::jit::drop(*stack, n);
          for (auto& r : results) stack->emplace_back(std::move(r));
          variant->hits++;
          return;
        }
      }
      variant->fallbacks++;
      original_.callBoxed(op, keys, stack);
      return;
    }
    state_->misses++;
    original_.callBoxed(op, keys, stack);
  }

 private:
  std::shared_ptr<RouteState> state_;
  c10::SafeKernelFunction original_;
};

struct Route {
  std::shared_ptr<RouteState> state;
  std::unique_ptr<torch::Library> library;
};

// Reads a variant description: the int64 layout written by kforge/runtime/native.py.
class Reader {
 public:
  Reader(const int64_t* data, int64_t n) : data_(data), n_(n) {}

  int64_t next() {
    TORCH_CHECK(at_ < n_, "variant description ends early");
    return data_[at_++];
  }
  std::vector<int64_t> list(int64_t count) {
    TORCH_CHECK(count >= 0 && at_ + count <= n_, "variant description ends early");
    std::vector<int64_t> out(data_ + at_, data_ + at_ + count);
    at_ += count;
    return out;
  }
  bool done() const { return at_ == n_; }

 private:
  const int64_t* data_;
  int64_t n_;
  int64_t at_ = 0;
};

c10::Device read_device(Reader& r) {
  const auto type = static_cast<c10::DeviceType>(r.next());
  const auto index = static_cast<c10::DeviceIndex>(r.next());
  return c10::Device(type, index);
}

TensorExpect read_tensor(Reader& r) {
  TensorExpect t;
  t.dtype = static_cast<c10::ScalarType>(r.next());
  t.device = read_device(r);
  const int64_t ndim = r.next();
  t.sizes = r.list(ndim);
  t.strides = r.list(ndim);
  t.offset = r.next();
  return t;
}

std::shared_ptr<Variant> read_variant(Reader& r) {
  auto v = std::make_shared<Variant>();
  v->device = read_device(r);
  const int64_t nargs = r.next();
  for (int64_t i = 0; i < nargs; ++i) {
    ArgExpect a;
    a.kind = static_cast<Kind>(r.next());
    switch (a.kind) {
      case kNone:
        break;
      case kTensor:
        a.tensors.push_back(read_tensor(r));
        break;
      case kInt: case kDouble: case kBool: case kWrappedInt: case kWrappedDouble: case kWrappedBool:
        a.value = r.next();
        break;
      case kIntList:
        a.ints = r.list(r.next());
        break;
      case kTensorList: {
        const int64_t count = r.next();
        for (int64_t j = 0; j < count; ++j) a.tensors.push_back(read_tensor(r));
        break;
      }
      default:
        TORCH_CHECK(false, "unknown argument kind ", static_cast<int64_t>(a.kind));
    }
    v->args.push_back(std::move(a));
  }
  const int64_t nout = r.next();
  for (int64_t i = 0; i < nout; ++i) {
    Output o;
    o.is_arg = r.next() != 0;
    if (o.is_arg) {
      o.arg = r.next();
      TORCH_CHECK(o.arg >= 0 && o.arg < nargs && v->args[o.arg].kind == kTensor,
                  "output ", i, " returns argument ", o.arg, ", which is not a tensor");
    } else {
      o.dtype = static_cast<c10::ScalarType>(r.next());
      const int64_t ndim = r.next();
      o.sizes = r.list(ndim);
      o.strides = r.list(ndim);
    }
    v->outputs.push_back(std::move(o));
  }
  v->returns = static_cast<Returns>(r.next());
  const int64_t nscratch = r.next();
  for (int64_t i = 0; i < nscratch; ++i) {
    const int64_t nbytes = r.next();
    v->scratch.emplace_back(nbytes, r.next() != 0);
  }
  const int64_t nlaunch = r.next();
  for (int64_t i = 0; i < nlaunch; ++i) {
    Launch l;
    l.function = reinterpret_cast<void*>(r.next());
    l.unaligned = reinterpret_cast<void*>(r.next());
    l.align = r.next();
    for (auto& g : l.grid) g = static_cast<unsigned>(r.next());
    for (auto& b : l.block) b = static_cast<unsigned>(r.next());
    l.shared_mem = static_cast<unsigned>(r.next());
    const int64_t nparams = r.next();
    TORCH_CHECK(nparams >= 0 && nparams <= 64, "a launch takes at most 64 parameters");
    l.values.assign(nparams, 0);
    for (int64_t p = 0; p < nparams; ++p) {
      const auto source = static_cast<Source>(r.next());
      if (source == kScalarParam) {
        l.values[p] = static_cast<uint64_t>(r.next());
        continue;
      }
      Pointer ptr{source, r.next(), r.next(), p};
      if (source == kArgPointer) {
        TORCH_CHECK(ptr.position >= 0 && ptr.position < nargs, "pointer to argument ",
                    ptr.position, " out of range");
        const Kind k = v->args[ptr.position].kind;
        TORCH_CHECK(k == kTensor || k == kNone || (k == kTensorList && ptr.item >= 0 &&
                    ptr.item < static_cast<int64_t>(v->args[ptr.position].tensors.size())),
                    "pointer to argument ", ptr.position, ", which is not a tensor");
        if (k == kNone) continue;  // a None optional: the null pointer stays
      } else if (source == kOutputPointer) {
        TORCH_CHECK(ptr.position >= 0 && ptr.position < nout, "pointer to output out of range");
      } else {
        TORCH_CHECK(source == kScratchPointer && ptr.position >= 0 && ptr.position < nscratch,
                    "pointer to scratch out of range");
      }
      l.pointers.push_back(ptr);
    }
    v->launches.push_back(std::move(l));
  }
  TORCH_CHECK(r.done(), "variant description has trailing data");
  return v;
}

void write_error(char* out, size_t size, const std::string& message) {
  if (size == 0) return;
  const size_t n = std::min(message.size(), size - 1);
  std::memcpy(out, message.data(), n);
  out[n] = '\0';
}

// A warning handler that drops the dispatcher's "overriding a previously registered kernel":
// putting kforge's kernel in front of the op's own is the point.
class QuietHandler : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

extern "C" {

// A route for aten op NAME (overload OVERLOAD, "" for the default) at dispatch key KEY ("CUDA"),
// installed in front of the op's own kernel; null with ERROR filled on failure.
void* kforge_route_new(const char* name, const char* overload, const char* key, char* error,
                       size_t error_size) {
  try {
    const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    const auto dispatch_key = c10::parseDispatchKey(key);
    auto original = handle.getComputedKernelForDispatchKey(dispatch_key);
    auto route = std::make_unique<Route>();
    route->state = std::make_shared<RouteState>();
    std::string qualified(name);
    const auto sep = qualified.find("::");
    const std::string ns = qualified.substr(0, sep);
    std::string op_name = qualified.substr(sep + 2);
    if (overload[0] != '\0') op_name += std::string(".") + overload;
    QuietHandler quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    route->library = std::make_unique<torch::Library>(
        torch::Library::IMPL, ns, dispatch_key, __FILE__, __LINE__);
    route->library->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                              std::make_unique<GuardKernel>(route->state,
                                                                            std::move(original))));
    return route.release();
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
    return nullptr;
  }
}

// Removes the route: the op's own kernel serves every call again.
void kforge_route_free(void* route) { delete static_cast<Route*>(route); }

// Calls that matched no variant of the route since it was made.
int64_t kforge_route_misses(void* route) {
  return static_cast<Route*>(route)->state->misses.load();
}

void kforge_route_reset(void* route) { static_cast<Route*>(route)->state->misses = 0; }

// A variant from its description (N int64 values at DATA); null with ERROR filled when the
// description is malformed. The handle is freed by kforge_variant_free.
void* kforge_variant_new(const int64_t* data, int64_t n, const char* label, char* error,
                         size_t error_size) {
  try {
    Reader reader(data, n);
    auto variant = read_variant(reader);
    variant->label = label;
    return new std::shared_ptr<Variant>(std::move(variant));
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
    return nullptr;
  }
}

void kforge_variant_free(void* variant) { delete static_cast<std::shared_ptr<Variant>*>(variant); }

// Hits, fallbacks and whether the variant is off; its reason into REASON when off.
void kforge_variant_counts(void* variant, int64_t* out, char* reason, size_t reason_size) {
  auto& v = **static_cast<std::shared_ptr<Variant>*>(variant);
  out[0] = v.hits.load();
  out[1] = v.fallbacks.load();
  out[2] = v.disabled.load() ? 1 : 0;
  std::lock_guard<std::mutex> hold(v.reason_lock);
  write_error(reason, reason_size, v.reason);
}

void kforge_variant_reset(void* variant) {
  auto& v = **static_cast<std::shared_ptr<Variant>*>(variant);
  v.hits = 0;
  v.fallbacks = 0;
}

// The route's variants from now on, in the order given (the first that matches serves).
void kforge_route_set(void* route, void** variants, int64_t n) {
  auto list = std::make_shared<std::vector<std::shared_ptr<Variant>>>();
  for (int64_t i = 0; i < n; ++i) {
    list->push_back(*static_cast<std::shared_ptr<Variant>*>(variants[i]));
  }
  std::atomic_store(&static_cast<Route*>(route)->state->variants,
                    std::shared_ptr<const std::vector<std::shared_ptr<Variant>>>(list));
}

// The ScalarType number of a dtype by its Python name ("float16"), or -1.
int64_t kforge_dtype_code(const char* name) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    const auto names = c10::getDtypeNames(type);
    if (names.first == name) return i;
  }
  return -1;
}

// The DeviceType number of a device type by name ("cuda"), or -1.
int64_t kforge_device_type_code(const char* name) {
  try {
    return static_cast<int64_t>(c10::Device(name).type());
  } catch (const std::exception&) {
    return -1;
  }
}

}  // extern "C"
