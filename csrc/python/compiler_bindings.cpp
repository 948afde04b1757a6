// poptorch._C's executables: the in-memory cache, the set of a wrapped model
// (precompiled files, compileAndExport) and the scope that names its disk cache.
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "compiler/executable.h"
#include "compiler/executable_lookup.h"
#include "compiler/serialization.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace poptorch::python {
namespace {

// `with _C.LookupScope(set, directory):` — see compiler::LookupScope.
class PyLookupScope {
 public:
  PyLookupScope(std::shared_ptr<compiler::ExecutableSet> set, std::optional<std::string> directory)
      : set_(std::move(set)), directory_(std::move(directory)) {}
  void enter() {
    TORCH_CHECK(!scope_, "this LookupScope is active already");
    scope_.emplace(set_, directory_);
  }
  void exit(const py::args&) { scope_.reset(); }

 private:
  std::shared_ptr<compiler::ExecutableSet> set_;
  std::optional<std::string> directory_;
  std::optional<compiler::LookupScope> scope_;
};

}  // namespace

void bindCompiler(py::module& m) {
  m.def("clear_executable_cache", [] { compiler::ExecutableCache::get().clear(); });
  m.def("executable_cache_size", [] { return compiler::ExecutableCache::get().size(); });
  m.def("executable_cache_capacity", [] { return compiler::ExecutableCache::get().capacity(); });
  m.def("set_executable_cache_capacity",
        [](size_t capacity) { compiler::ExecutableCache::get().setCapacity(capacity); });
  py::class_<compiler::ExecutableSet, std::shared_ptr<compiler::ExecutableSet>>(
      m, "ExecutableSet",
      "The executables of a wrapped model: loaded from a precompiled file, and used by its "
      "captures (what compileAndExport writes).")
      .def(py::init<>())
      .def(
          "add", [](compiler::ExecutableSet& set, const py::bytes& entry) { set.add(entry); },
          "Adds an entry (bytes); raises if it is not an entry of this build.")
      .def(
          "entries",
          [](const compiler::ExecutableSet& set) {
            py::list entries;
            for (const std::string& entry : set.entries()) entries.append(py::bytes(entry));
            return entries;
          },
          "Every executable of the set, as entry bytes.")
      .def("__len__", &compiler::ExecutableSet::size);
  py::class_<PyLookupScope>(m, "LookupScope",
                            "While active, this thread's graphs also find executables in `set` "
                            "and record there those they use; `directory` replaces "
                            "POPTORCH_CACHE_DIR ('' for no disk cache, None to keep it).")
      .def(py::init<std::shared_ptr<compiler::ExecutableSet>, std::optional<std::string>>(),
           py::arg("set"), py::arg("directory"))
      .def("__enter__", &PyLookupScope::enter)
      .def("__exit__", &PyLookupScope::exit);
  m.def("build_identity", &compiler::buildIdentity,
        "The executable format, torch's version and this build: what entries must match.");
}

}  // namespace poptorch::python
