#include "compiler/serialization.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <absl/strings/str_cat.h>
#include <c10/util/safe_numerics.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/headeronly/version.h>

#include <bit>
#include <cstring>
#include <functional>
#include <string_view>

#include "common/denormal_mode.h"
#include "ir/hash.h"

namespace poptorch::compiler {
namespace {

// Bumped whenever the trees below change.
constexpr int64_t kFormatVersion = 5;

// --- the build ----------------------------------------------------------------

std::string hex(const unsigned char* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

// The GNU build id of the loaded object (our extension module, or a test
// binary) that holds this code: it changes whenever the code does.
std::string gnuBuildId() {
  struct Search {
    uintptr_t address;
    std::string id;
  } search{reinterpret_cast<uintptr_t>(&gnuBuildId), ""};
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) -> int {
        auto* search = static_cast<Search*>(data);
        bool holds_us = false;
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = object->dlpi_phdr[i];
          const uintptr_t start = object->dlpi_addr + segment.p_vaddr;
          holds_us = holds_us || (segment.p_type == PT_LOAD && search->address >= start &&
                                  search->address < start + segment.p_memsz);
        }
        if (!holds_us) return 0;
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = object->dlpi_phdr[i];
          if (segment.p_type != PT_NOTE) continue;
          const char* note = reinterpret_cast<const char*>(object->dlpi_addr + segment.p_vaddr);
          const char* end = note + segment.p_memsz;
          while (note + sizeof(ElfW(Nhdr)) <= end) {
            const auto* header = reinterpret_cast<const ElfW(Nhdr)*>(note);
            const char* name = note + sizeof(ElfW(Nhdr));
            const char* desc = name + ((header->n_namesz + 3) & ~3u);
            if (header->n_type == NT_GNU_BUILD_ID && header->n_namesz == 4 &&
                std::memcmp(name, "GNU", 4) == 0) {
              search->id = hex(reinterpret_cast<const unsigned char*>(desc), header->n_descsz);
              return 1;
            }
            note = desc + ((header->n_descsz + 3) & ~3u);
          }
        }
        return 1;
      },
      &search);
  return search.id;
}

// Without a build id (a linker that writes none), the binary's path, size
// and modification time tell builds apart.
std::string binaryStamp() {
  Dl_info info;
  struct stat status {};
  if (dladdr(reinterpret_cast<void*>(&binaryStamp), &info) == 0 || info.dli_fname == nullptr ||
      stat(info.dli_fname, &status) != 0) {
    return "unknown";
  }
  return absl::StrCat(info.dli_fname, ":", status.st_size, ":", status.st_mtime);
}

// --- encoding -----------------------------------------------------------------

int64_t asInt(uint64_t value) { return std::bit_cast<int64_t>(value); }

template <typename Range>
c10::List<int64_t> ints(const Range& values) {
  c10::List<int64_t> list;
  list.reserve(values.size());
  for (auto v : values) list.push_back(static_cast<int64_t>(v));
  return list;
}

template <typename Range>
c10::List<bool> bools(const Range& values) {
  c10::List<bool> list;
  list.reserve(values.size());
  for (bool v : values) list.push_back(v);
  return list;
}

c10::impl::GenericList anyList() { return c10::impl::GenericList(c10::AnyType::get()); }

c10::impl::GenericDict stringDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

c10::IValue tuple(std::vector<c10::IValue> elements) {
  return c10::ivalue::Tuple::create(std::move(elements));
}

c10::IValue encodeRef(const ir::TensorRef& ref) {
  return tuple({ref.buffer, static_cast<int64_t>(ref.dtype), ref.offset, ints(ref.sizes),
                ints(ref.strides), ref.conj, ref.neg});
}

// Constants pickle as they are, when they are plain values.
void checkPlain(const c10::IValue& value) {
  if (value.isNone() || value.isBool() || value.isInt() || value.isDouble() ||
      value.isComplexDouble() || value.isString() || value.isDevice()) {
    return;
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) checkPlain(element);
    return;
  }
  if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) checkPlain(element);
    return;
  }
  throw NotSerializable(absl::StrCat("a constant of kind ", value.tagKind()));
}

// A constant as (how it is encoded, what).
c10::IValue encodeConstant(const c10::IValue& value) {
  // A random op's generator is replaced by one seeded from the run's seed.
  if (value.isGenerator()) return tuple({"generator", c10::IValue()});
  if (value.isTensor() && !value.toTensor().defined()) return tuple({"undefined", c10::IValue()});
  checkPlain(value);
  return tuple({"value", value});
}

// Of a runtime argument, only what the structural hash sees: its kind.
c10::IValue encodeRuntimeKind(const c10::IValue& value) {
  if (value.isTensor())
    return tuple({"tensor", static_cast<int64_t>(value.toTensor().scalar_type())});
  if (value.isScalar()) return tuple({"scalar", static_cast<int64_t>(value.toScalar().type())});
  return tuple({"other", value.tagKind()});
}

c10::IValue encodeNode(const ir::Node& node) {
  auto args = anyList();
  for (size_t a = 0; a < node.args.size(); ++a) {
    const ir::Arg& arg = node.args[a];
    c10::IValue value;
    if (arg.kind == ir::ArgKind::kConstant) {
      if (arg.value.isGenerator() && !(node.seed && node.generator_arg == static_cast<int>(a))) {
        throw NotSerializable(
            absl::StrCat(node.name(), " takes a generator it draws no seed from"));
      }
      value = encodeConstant(arg.value);
    } else if (arg.kind == ir::ArgKind::kRuntime) {
      value = encodeRuntimeKind(arg.value);
    }
    args.push_back(tuple({static_cast<int64_t>(arg.kind), std::move(value), ints(arg.refs),
                          arg.optional_elements, static_cast<int64_t>(arg.layout)}));
  }
  auto inputs = anyList();
  for (const ir::TensorRef& ref : node.inputs) inputs.push_back(encodeRef(ref));
  auto outputs = anyList();
  for (const ir::TensorRef& ref : node.outputs) outputs.push_back(encodeRef(ref));
  const c10::OperatorName& name = node.op.operator_name();
  return tuple(
      {name.name, name.overload_name, std::move(args), std::move(inputs), std::move(outputs),
       ints(node.writes), bools(node.fresh_returns), node.source_index, node.seed.has_value(),
       node.generator_arg, static_cast<int64_t>(node.guard),
       ints(std::vector<int32_t>{node.placement.block, node.placement.stage, node.placement.phase,
                                 node.placement.ipu}),
       ints(std::vector<int64_t>{static_cast<int64_t>(node.matmul.split), node.matmul.factor,
                                 std::bit_cast<uint32_t>(node.matmul.available_memory)}),
       static_cast<int64_t>(node.denormal_mode), node.deterministic, node.deterministic_warn_only});
}

c10::IValue encodeGraph(const ir::Graph& graph) {
  auto buffers = anyList();
  for (const ir::BufferInfo& b : graph.buffers) {
    buffers.push_back(
        tuple({b.nbytes, static_cast<int64_t>(b.device.type()),
               static_cast<int64_t>(b.device.index()), b.existed_before, b.live_after}));
  }
  auto nodes = anyList();
  for (const ir::Node& node : graph.nodes) nodes.push_back(encodeNode(node));
  auto tree = stringDict();
  tree.insert("buffers", std::move(buffers));
  tree.insert("nodes", std::move(nodes));
  return tree;
}

c10::IValue encodeOperator(const std::optional<c10::OperatorHandle>& op) {
  if (!op) return c10::IValue();
  const c10::OperatorName& name = op->operator_name();
  return tuple({name.name, name.overload_name});
}

// --- decoding -----------------------------------------------------------------

// A value of the tree being decoded and where it is, named only in errors.
class Field {
 public:
  Field(c10::IValue value, const char* root) : value_(std::move(value)), key_(root) {}

  [[noreturn]] void fail(const std::string& what) const {
    C10_THROW_ERROR(Error, absl::StrCat("not a valid executable entry: ", path(), " ", what));
  }

  const c10::IValue& value() const { return value_; }
  bool isNone() const { return value_.isNone(); }

  int64_t integer() const {
    if (!value_.isInt()) fail("is not an integer");
    return value_.toInt();
  }
  int64_t integer(int64_t min, int64_t max) const {
    const int64_t v = integer();
    if (v < min || v > max) fail(absl::StrCat("is ", v, ", out of [", min, ", ", max, "]"));
    return v;
  }
  bool boolean() const {
    if (!value_.isBool()) fail("is not a boolean");
    return value_.toBool();
  }
  const std::string& string() const {
    if (!value_.isString()) fail("is not a string");
    return value_.toStringRef();
  }

  size_t size() const { return elements().size(); }
  Field operator[](size_t i) const {
    const auto all = elements();
    if (i >= all.size()) fail(absl::StrCat("has ", all.size(), " elements, not ", i + 1));
    return Field(all[i], this, i);
  }
  // A tuple or list of exactly n elements.
  Field sized(size_t n) const {
    if (size() != n) fail(absl::StrCat("has ", size(), " elements, not ", n));
    return *this;
  }
  Field at(const char* key) const {
    if (!value_.isGenericDict()) fail("is not a dict");
    const auto dict = value_.toGenericDict();
    const auto it = dict.find(key);
    if (it == dict.end()) fail(absl::StrCat("has no '", key, "'"));
    return Field(it->value(), this, key);
  }

 private:
  // A child names its parent, which outlives it (children are temporaries).
  Field(c10::IValue value, const Field* parent, size_t index)
      : value_(std::move(value)), parent_(parent), index_(index) {}
  Field(c10::IValue value, const Field* parent, const char* key)
      : value_(std::move(value)), parent_(parent), key_(key) {}

  c10::ArrayRef<c10::IValue> elements() const {
    if (value_.isTuple()) return value_.toTupleRef().elements().asArrayRef();
    if (value_.isList()) return value_.toListRef();
    fail("is not a tuple or a list");
  }

  std::string path() const {
    const std::string prefix = parent_ ? parent_->path() : "";
    return key_ ? absl::StrCat(prefix, parent_ ? "." : "", key_)
                : absl::StrCat(prefix, "[", index_, "]");
  }

  c10::IValue value_;
  const Field* parent_ = nullptr;
  const char* key_ = nullptr;
  size_t index_ = 0;
};

c10::OperatorHandle decodeOperator(const Field& name, const Field& overload) {
  auto handle = c10::Dispatcher::singleton().findSchema({name.string(), overload.string()});
  if (!handle) {
    name.fail(absl::StrCat("names ", name.string(), ".", overload.string(),
                           ", an operator not registered in this process"));
  }
  return *handle;
}

template <typename T>
T decodeEnum(const Field& f, T last) {
  return static_cast<T>(f.integer(0, static_cast<int64_t>(last)));
}

std::vector<int64_t> decodeInts(const Field& f) {
  std::vector<int64_t> out(f.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = f[i].integer();
  return out;
}

ir::TensorRef decodeRef(const Field& f, const std::vector<ir::BufferInfo>& buffers) {
  f.sized(7);
  ir::TensorRef ref;
  ref.buffer = static_cast<ir::BufferId>(f[0].integer(0, static_cast<int64_t>(buffers.size()) - 1));
  ref.dtype = static_cast<c10::ScalarType>(
      f[1].integer(0, static_cast<int64_t>(c10::ScalarType::NumOptions) - 1));
  ref.offset = f[2].integer(0, std::numeric_limits<int64_t>::max());
  for (int64_t s : decodeInts(f[3])) ref.sizes.push_back(s);
  for (int64_t s : decodeInts(f[4])) ref.strides.push_back(s);
  ref.conj = f[5].boolean();
  ref.neg = f[6].boolean();
  if (ref.sizes.size() != ref.strides.size()) f.fail("has as many sizes as strides");
  if (ref.dtype == c10::ScalarType::Undefined) f.fail("has no dtype");
  // The view must lie within its buffer: the runtime trusts it.
  int64_t last = ref.offset;  // the last element it reads
  bool empty = false;
  for (size_t d = 0; d < ref.sizes.size(); ++d) {
    int64_t step = 0;
    if (ref.sizes[d] < 0 || ref.strides[d] < 0) f.fail("has a negative size or stride");
    empty = empty || ref.sizes[d] == 0;
    if (ref.sizes[d] > 0 && (c10::mul_overflows(ref.sizes[d] - 1, ref.strides[d], &step) ||
                             c10::add_overflows(last, step, &last))) {
      f.fail("overflows");
    }
  }
  const auto element = static_cast<int64_t>(c10::elementSize(ref.dtype));
  int64_t end = 0;
  if (!empty && (c10::add_overflows(last, int64_t{1}, &end) ||
                 c10::mul_overflows(end, element, &end) || end > buffers[ref.buffer].nbytes)) {
    f.fail("reads past the end of its buffer");
  }
  return ref;
}

c10::IValue decodeConstant(const Field& f) {
  f.sized(2);
  const std::string& how = f[0].string();
  if (how == "generator") return c10::IValue();  // see encodeNode: always replaced
  if (how == "undefined") return at::Tensor();
  if (how != "value") f[0].fail("is not a kind of constant");
  return f[1].value();
}

ir::Node decodeNode(const Field& f, const std::vector<ir::BufferInfo>& buffers) {
  f.sized(16);
  ir::Node node(decodeOperator(f[0], f[1]));
  const c10::FunctionSchema& schema = node.op.schema();
  const Field inputs = f[3];
  for (size_t i = 0; i < inputs.size(); ++i) node.inputs.push_back(decodeRef(inputs[i], buffers));
  const Field outputs = f[4];
  for (size_t i = 0; i < outputs.size(); ++i) {
    node.outputs.push_back(decodeRef(outputs[i], buffers));
  }
  const Field writes = f[5];
  for (size_t i = 0; i < writes.size(); ++i) {
    node.writes.push_back(
        static_cast<ir::BufferId>(writes[i].integer(0, static_cast<int64_t>(buffers.size()) - 1)));
  }
  const Field fresh = f[6].sized(schema.returns().size());
  for (size_t i = 0; i < fresh.size(); ++i) node.fresh_returns.push_back(fresh[i].boolean());
  node.source_index = static_cast<int32_t>(f[7].integer(0, std::numeric_limits<int32_t>::max()));
  if (f[8].boolean()) node.seed = 0;  // the run's seed comes from the graph as captured
  node.generator_arg =
      static_cast<int32_t>(f[9].integer(-1, static_cast<int64_t>(schema.arguments().size()) - 1));
  node.guard = decodeEnum(f[10], ir::Guard::kShape);
  const std::vector<int64_t> placement = decodeInts(f[11].sized(4));
  for (int64_t v : placement) {
    if (v < ir::Placement::kOutsideBlocks || v > std::numeric_limits<int32_t>::max()) {
      f[11].fail("is not a placement");
    }
  }
  node.placement = {static_cast<int32_t>(placement[0]), static_cast<int32_t>(placement[1]),
                    static_cast<int32_t>(placement[2]), static_cast<int32_t>(placement[3])};
  const Field plan = f[12].sized(3);
  node.matmul.split = decodeEnum(plan[0], ir::MatMulPlan::Split::kOutputChannels);
  node.matmul.factor =
      static_cast<int32_t>(plan[1].integer(1, std::numeric_limits<int32_t>::max()));
  node.matmul.available_memory =
      std::bit_cast<float>(static_cast<uint32_t>(plan[2].integer(0, UINT32_MAX)));
  node.denormal_mode = static_cast<uint32_t>(f[13].integer(0, UINT32_MAX));
  if (!isDenormalMode(node.denormal_mode)) f[13].fail("is not a denormal mode");
  node.deterministic = f[14].boolean();
  node.deterministic_warn_only = f[15].boolean();

  const Field args = f[2].sized(schema.arguments().size());
  const auto num_inputs = static_cast<int64_t>(node.inputs.size());
  for (size_t a = 0; a < args.size(); ++a) {
    const Field arg = args[a].sized(5);
    ir::Arg decoded;
    decoded.kind = decodeEnum(arg[0], ir::ArgKind::kRuntime);
    for (int64_t r : decodeInts(arg[2])) {
      // A runtime argument's refs name a captured node and its argument,
      // checked against the graph in checkFits.
      if (decoded.kind == ir::ArgKind::kRuntime) {
        if (r < 0 || r > std::numeric_limits<int32_t>::max()) arg[2].fail("is out of range");
      } else if (r < -1 || r >= num_inputs) {
        arg[2].fail("refers to a missing input");
      }
      decoded.refs.push_back(static_cast<int32_t>(r));
    }
    decoded.optional_elements = arg[3].boolean();
    decoded.layout = decodeEnum(arg[4], ir::Layout::kChannelsLast);
    switch (decoded.kind) {
      case ir::ArgKind::kConstant:
        decoded.value = decodeConstant(arg[1]);
        if (arg[1][0].string() == "generator" &&
            !(node.seed && node.generator_arg == static_cast<int32_t>(a))) {
          arg[1].fail("is a generator of an op that draws no seed");
        }
        break;
      case ir::ArgKind::kTensor:
        if (decoded.refs.size() != 1 || decoded.refs[0] < 0) arg[2].fail("is not one input");
        break;
      case ir::ArgKind::kTensorList:
        break;
      case ir::ArgKind::kRuntime:  // its value is the captured graph's
        if (!decoded.refs.empty() && decoded.refs.size() != 2) {
          arg[2].fail("is not a captured node and argument");
        }
        break;
    }
    node.args.push_back(std::move(decoded));
  }
  return node;
}

ir::Graph decodeGraph(const Field& f) {
  ir::Graph graph;
  const Field buffers = f.at("buffers");
  for (size_t b = 0; b < buffers.size(); ++b) {
    const Field buffer = buffers[b].sized(5);
    ir::BufferInfo info;
    info.nbytes = buffer[0].integer(0, std::numeric_limits<int64_t>::max());
    info.device = c10::Device(
        static_cast<c10::DeviceType>(buffer[1].integer(
            0, static_cast<int64_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES) - 1)),
        static_cast<c10::DeviceIndex>(buffer[2].integer(-1, 127)));
    info.existed_before = buffer[3].boolean();
    info.live_after = buffer[4].boolean();
    graph.buffers.push_back(info);
  }
  const Field nodes = f.at("nodes");
  for (size_t n = 0; n < nodes.size(); ++n)
    graph.nodes.push_back(decodeNode(nodes[n], graph.buffers));
  return graph;
}

// What the runtime relies on beyond each field's own range.
void checkConsistent(const Executable& exe, const Field& f) {
  const ir::Graph& program = exe.program;
  const size_t num_buffers = program.buffers.size();
  if (exe.roles.size() != num_buffers || exe.flexible_layout.size() != num_buffers ||
      exe.arena_offset.size() != num_buffers) {
    f.fail("has per-buffer plans of another length than its buffers");
  }
  if (exe.release_after.size() != program.nodes.size() ||
      exe.out_variant.size() != program.nodes.size()) {
    f.fail("has per-node plans of another length than its nodes");
  }
  auto touched = [&](ir::BufferId b) {
    if (exe.roles[b] == BufferRole::kUnused) f.fail("uses a buffer it plans as unused");
  };
  for (const ir::Node& node : program.nodes) {
    for (const ir::TensorRef& ref : node.inputs) touched(ref.buffer);
    for (const ir::TensorRef& ref : node.outputs) touched(ref.buffer);
    for (ir::BufferId b : node.writes) touched(b);
  }
  for (size_t b = 0; b < num_buffers; ++b) {
    const ir::BufferInfo& info = program.buffers[b];
    const bool temporary =
        exe.roles[b] == BufferRole::kProduced || exe.roles[b] == BufferRole::kScratch;
    if ((exe.roles[b] == BufferRole::kExternal) != (info.existed_before || info.live_after) &&
        exe.roles[b] != BufferRole::kUnused) {
      f.fail("plans a buffer outside the graph as a temporary, or the reverse");
    }
    int64_t end = 0;
    if (temporary &&
        (exe.arena_offset[b] < 0 || c10::add_overflows(exe.arena_offset[b], info.nbytes, &end) ||
         end > exe.arena_bytes)) {
      f.fail("places a temporary outside its arena");
    }
  }
  for (ir::BufferId b : exe.guarded_writes) {
    if (exe.roles[b] != BufferRole::kExternal) f.fail("guards a write to a temporary");
  }
}

// PyTorch's zip reader checks no CRC: a checksum of our own finds damage that
// still unpickles. std::hash of bytes is stable for a build, as entries are.
int64_t checksum(std::string_view structure, std::string_view executable) {
  const std::hash<std::string_view> hash;
  return asInt(ir::hashCombine(hash(structure), hash(executable)));
}

at::Tensor byteTensor(std::string_view bytes) {
  at::Tensor tensor = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions(at::kByte));
  std::memcpy(tensor.mutable_data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

// The bytes of a field holding a byte tensor (alive as long as the tree).
std::string_view bytesOf(const Field& f) {
  const c10::IValue& value = f.value();
  if (!value.isTensor() || value.toTensor().scalar_type() != at::kByte ||
      value.toTensor().dim() != 1 || !value.toTensor().is_contiguous()) {
    f.fail("is not a byte tensor");
  }
  const at::Tensor& tensor = value.toTensor();
  return {static_cast<const char*>(tensor.const_data_ptr()), static_cast<size_t>(tensor.numel())};
}

}  // namespace

const std::string& buildIdentity() {
  static const std::string identity = [] {
    std::string build = gnuBuildId();
    if (build.empty()) build = binaryStamp();
    return absl::StrCat("poptorch executable format ", kFormatVersion, ", torch ", TORCH_VERSION,
                        ", build ", build);
  }();
  return identity;
}

c10::IValue executableToIValue(const Executable& exe) {
  auto release_after = anyList();
  for (const auto& released : exe.release_after) release_after.push_back(ints(released));
  auto out_variants = anyList();
  for (const auto& op : exe.out_variant) out_variants.push_back(encodeOperator(op));
  std::vector<int64_t> roles;
  for (BufferRole role : exe.roles) roles.push_back(static_cast<int64_t>(role));
  auto tree = stringDict();
  tree.insert("key", asInt(exe.key));
  tree.insert("program", encodeGraph(exe.program));
  tree.insert("roles", ints(roles));
  tree.insert("flexible_layout", bools(exe.flexible_layout));
  tree.insert("release_after", std::move(release_after));
  tree.insert("peak_temporary_bytes", ints(exe.peak_temporary_bytes));
  tree.insert("arena_offset", ints(exe.arena_offset));
  tree.insert("arena_bytes", exe.arena_bytes);
  tree.insert("out_variant", std::move(out_variants));
  tree.insert("has_guards", exe.has_guards);
  tree.insert("guarded_writes", ints(exe.guarded_writes));
  return tree;
}

std::shared_ptr<const Executable> executableFromIValue(const c10::IValue& tree) {
  const Field f(tree, "executable");
  auto exe = std::make_shared<Executable>();
  exe->key = std::bit_cast<uint64_t>(f.at("key").integer());
  exe->program = decodeGraph(f.at("program"));
  const auto last_buffer = static_cast<int64_t>(exe->program.buffers.size()) - 1;
  const Field roles = f.at("roles");
  for (size_t b = 0; b < roles.size(); ++b) {
    exe->roles.push_back(decodeEnum(roles[b], BufferRole::kScratch));
  }
  const Field flexible = f.at("flexible_layout");
  for (size_t b = 0; b < flexible.size(); ++b)
    exe->flexible_layout.push_back(flexible[b].boolean());
  const Field release_after = f.at("release_after");
  for (size_t n = 0; n < release_after.size(); ++n) {
    std::vector<ir::BufferId> released;
    for (size_t i = 0; i < release_after[n].size(); ++i) {
      released.push_back(static_cast<ir::BufferId>(release_after[n][i].integer(0, last_buffer)));
    }
    exe->release_after.push_back(std::move(released));
  }
  const Field peaks = f.at("peak_temporary_bytes");
  for (size_t d = 0; d < peaks.size(); ++d) {
    exe->peak_temporary_bytes.push_back(peaks[d].integer(0, std::numeric_limits<int64_t>::max()));
  }
  const Field offsets = f.at("arena_offset");
  for (size_t b = 0; b < offsets.size(); ++b) {
    exe->arena_offset.push_back(offsets[b].integer(-1, std::numeric_limits<int64_t>::max()));
  }
  exe->arena_bytes = f.at("arena_bytes").integer(0, std::numeric_limits<int64_t>::max());
  const Field out_variants = f.at("out_variant");
  for (size_t n = 0; n < out_variants.size(); ++n) {
    const Field op = out_variants[n];
    if (op.isNone()) {
      exe->out_variant.emplace_back();
    } else {
      exe->out_variant.emplace_back(decodeOperator(op.sized(2)[0], op[1]));
    }
  }
  exe->has_guards = f.at("has_guards").boolean();
  const Field guarded = f.at("guarded_writes");
  for (size_t i = 0; i < guarded.size(); ++i) {
    exe->guarded_writes.push_back(static_cast<ir::BufferId>(guarded[i].integer(0, last_buffer)));
  }
  checkConsistent(*exe, f);
  exe->dependencies = nodeDependencies(*exe);
  return exe;
}

std::string structureOf(const ir::Graph& graph) {
  const std::vector<char> bytes = torch::jit::pickle(encodeGraph(graph));
  return std::string(bytes.begin(), bytes.end());
}

std::string encodeEntry(const Entry& entry) {
  const std::vector<char> executable = torch::jit::pickle(executableToIValue(*entry.executable));
  const std::string_view program(executable.data(), executable.size());
  auto tree = stringDict();
  tree.insert("identity", buildIdentity());
  tree.insert("checksum", checksum(entry.structure, program));
  tree.insert("structure", byteTensor(entry.structure));
  tree.insert("executable", byteTensor(program));
  const std::vector<char> bytes = torch::jit::pickle_save(tree);
  return std::string(bytes.begin(), bytes.end());
}

Entry decodeEntry(const std::string& bytes) {
  c10::IValue tree;
  try {
    tree = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "not a valid executable entry: it cannot be read (", error.what(), ")");
  }
  const Field f(tree, "entry");
  const std::string& identity = f.at("identity").string();
  TORCH_CHECK(identity == buildIdentity(), "an executable of another build: ", identity,
              " (this is ", buildIdentity(), ")");
  Entry entry;
  entry.structure = std::string(bytesOf(f.at("structure")));
  const std::string_view program = bytesOf(f.at("executable"));
  if (f.at("checksum").integer() != checksum(entry.structure, program)) {
    f.fail("is damaged: its checksum does not match its content");
  }
  c10::IValue executable;
  try {
    executable = torch::jit::unpickle(program.data(), program.size());
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "not a valid executable entry: its executable cannot be read (",
                error.what(), ")");
  }
  entry.executable = executableFromIValue(executable);
  return entry;
}

void checkFits(const Executable& exe, const ir::Graph& captured) {
  const auto& buffers = exe.program.buffers;
  bool fits = buffers.size() == captured.buffers.size();
  for (size_t b = 0; fits && b < buffers.size(); ++b) {
    const ir::BufferInfo& mine = buffers[b];
    const ir::BufferInfo& theirs = captured.buffers[b];
    fits = mine.nbytes == theirs.nbytes && mine.device == theirs.device &&
           mine.existed_before == theirs.existed_before && mine.live_after == theirs.live_after;
  }
  TORCH_CHECK(fits, "not a valid executable entry: its buffers are not the graph's");
  const auto num_nodes = static_cast<int32_t>(captured.nodes.size());
  for (const ir::Node& node : exe.program.nodes) {
    TORCH_CHECK(node.source_index < num_nodes,
                "not a valid executable entry: a node comes from beyond the graph");
    for (const ir::Arg& arg : node.args) {
      if (arg.kind != ir::ArgKind::kRuntime || arg.refs.empty()) continue;
      TORCH_CHECK(arg.refs[0] < num_nodes &&
                      arg.refs[1] < static_cast<int32_t>(captured.nodes[arg.refs[0]].args.size()) &&
                      captured.nodes[arg.refs[0]].args[arg.refs[1]].kind == ir::ArgKind::kRuntime,
                  "not a valid executable entry: a runtime argument comes from beyond the graph");
    }
  }
}

}  // namespace poptorch::compiler
