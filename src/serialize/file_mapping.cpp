#include "serialize/file_mapping.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace torchattn::serialize {

namespace {

// Asks the kernel to read the mapped file into the page cache in 2 MiB folios and to map
// them with one page-table entry each (MADV_HUGEPAGE: a hint; where the kernel or its
// settings refuse it, nothing changes). Folios already in the page cache keep their
// size, so a file first read without the hint stays in small folios until it is evicted.
void prefer_huge_pages(uint8_t* p, size_t n) {
#if defined(MADV_HUGEPAGE)
  (void)::madvise(p, n, MADV_HUGEPAGE);
#else
  (void)p;
  (void)n;
#endif
}

}  // namespace

FileMapping::FileMapping(const std::string& path, const char* reader) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, reader, ": cannot open '", path, "': ", std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, reader, ": cannot stat '", path, "': ", std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    // Writable and private: a caller that writes into a tensor gets its own copy of
    // those pages; the file never changes.
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(p != MAP_FAILED, reader, ": cannot map '", path, "': ", std::strerror(err));
    data_ = static_cast<uint8_t*>(p);
    prefer_huge_pages(data_, size_);
  } else {
    ::close(fd);
  }
}

FileMapping::~FileMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void FileMapping::release(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (start + page - 1) / page * page, last = (start + n) / page * page;
  if (last > first) ::madvise(const_cast<uint8_t*>(p) + (first - start), last - first, MADV_DONTNEED);
}

}  // namespace torchattn::serialize
