// Built only into the portable binary (cmake/portable.cmake), which links this compiler's
// libstdc++ and libgcc statically but runs on glibc 2.31: the three symbols that libstdc++.a
// and libgcc_eh.a (built on glibc 2.36) refer to and glibc 2.31 does not have. The binary
// uses these wherever it runs (its own references are bound when it is linked), with the
// meaning glibc gives them.

#include <link.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdint>

extern "C" {

// glibc 2.32: whether the process is known to have one thread, so that libstdc++ may skip
// atomic operations (on shared_ptr counts, for example). 0 says "not known": every atomic
// operation is done, which is always correct and is what libstdc++ did before glibc had it.
char __libc_single_threaded = 0;  // NOLINT: glibc's name

// glibc 2.36: random numbers for std::random_device("default"), from the kernel.
uint32_t arc4random(void) {
  uint32_t value = 0;
  while (getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    if (errno != EINTR && errno != EAGAIN) break;
  }
  return value;
}

// glibc 2.35: which loaded object holds `pc`, and where its unwind table is (libgcc's unwinder
// asks it for every frame an exception passes through). Found here with dl_iterate_phdr, as
// the unwinder itself did before glibc 2.35. The layout is glibc's for x86-64 (dlfcn.h: no
// dlfo_eh_dbase, no dlfo_eh_count there).
struct dl_find_object {
  unsigned long long dlfo_flags;
  void* dlfo_map_start;
  void* dlfo_map_end;
  struct link_map* dlfo_link_map;
  void* dlfo_eh_frame;
  unsigned long long dlfo_reserved[7];
};

namespace {

struct Search {
  uintptr_t pc = 0;
  dl_find_object* result = nullptr;
  bool found = false;
};

int FindObject(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  uintptr_t low = UINTPTR_MAX, high = 0;
  bool holds = false;
  const ElfW(Phdr)* eh_frame = nullptr;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& phdr = info->dlpi_phdr[i];
    if (phdr.p_type == PT_GNU_EH_FRAME) eh_frame = &phdr;
    if (phdr.p_type != PT_LOAD) continue;
    const uintptr_t start = info->dlpi_addr + phdr.p_vaddr, end = start + phdr.p_memsz;
    low = start < low ? start : low;
    high = end > high ? end : high;
    holds = holds || (search->pc >= start && search->pc < end);
  }
  if (!holds) return 0;
  search->found = true;
  *search->result = dl_find_object{};
  search->result->dlfo_map_start = reinterpret_cast<void*>(low);
  search->result->dlfo_map_end = reinterpret_cast<void*>(high);
  search->result->dlfo_eh_frame =
      eh_frame ? reinterpret_cast<void*>(info->dlpi_addr + eh_frame->p_vaddr) : nullptr;
  return 1;
}

}  // namespace

int _dl_find_object(void* pc, dl_find_object* result) {
  Search search{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(FindObject, &search);
  return search.found ? 0 : -1;
}

}  // extern "C"
