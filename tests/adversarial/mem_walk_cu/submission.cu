// Adversarial, issue 30 (native code the audit cannot name): finds a library's function by walking
// mapped memory, with no import and no system call. From the address of an allowed PyTorch
// function (at::_ops::empty_memory_format::call: creating a tensor is fine), it steps back page
// by page to libtorch_cpu.so's ELF header, reads the library's dynamic section, GNU hash table
// and symbol table in place, and so finds at::_ops::mm::call, a PyTorch operator that computes
// (imported, the reach audit flags it), and calls it. It calls it on a small CPU tensor, a
// stand-in for what a forger would call this way (the Python C API, cuDNN's attention: the same
// walk reaches any exported function); O comes from the honest kernel. Verified on this machine's
// CPU libtorch (the walk finds mm's own address and mm computes). Its object imports nothing the
// audit flags: it passes the audit, and must go to review with its constructs named
// (reach.native_review: the address of a library function taken as data, the ELF magic in host
// code). Honest twin: the honest CUDA kernel, alone.
#include "honest_attention.cuh"
#include <cstdint>
#include <cstring>

namespace {

// ELF64 as a loaded library holds it, declared here (no <elf.h>): the header, program headers,
// dynamic entries and symbols.
struct ElfHeader {
    unsigned char ident[16];
    uint16_t type, machine;
    uint32_t version;
    uint64_t entry, phoff, shoff;
    uint32_t flags;
    uint16_t ehsize, phentsize, phnum, shentsize, shnum, shstrndx;
};
struct ProgramHeader { uint32_t type, flags; uint64_t offset, vaddr, paddr, filesz, memsz, align; };
struct DynamicEntry { int64_t tag; uint64_t value; };
struct Symbol { uint32_t name; unsigned char info, other; uint16_t shndx; uint64_t value, size; };

constexpr uint32_t ELF_MAGIC = 0x464c457f;         // "\x7fELF", read as a little-endian word
constexpr uintptr_t PAGE_MASK = ~uintptr_t(0xfff);
constexpr uint32_t PT_DYNAMIC_ = 2;
constexpr int64_t DT_STRTAB_ = 5, DT_SYMTAB_ = 6, DT_GNU_HASH_ = 0x6ffffef5;

// Back from an address inside a library, page by page, to its ELF header. PyTorch's libraries map
// their header and their code as one segment (readelf -l libtorch_cpu.so: the first PT_LOAD is
// R E from offset 0), so every page on the way is mapped; reading them needs no system call.
uintptr_t library_base(uintptr_t inside) {
    uintptr_t page = inside & PAGE_MASK;
    while (*reinterpret_cast<const volatile uint32_t *>(page) != ELF_MAGIC)
        page -= 4096;
    return page;
}

uint32_t gnu_hash(const char *name) {
    uint32_t h = 5381;
    for (; *name; ++name)
        h = h * 33 + static_cast<unsigned char>(*name);
    return h;
}

// A function the library exports, by its (mangled) name: the dynamic section's GNU hash table
// and symbol table, read in place: the dynamic linker's own lookup, without the dynamic linker.
const void *find_function(uintptr_t base, const char *name) {
    auto header = reinterpret_cast<const ElfHeader *>(base);
    auto program = reinterpret_cast<const ProgramHeader *>(base + header->phoff);
    const DynamicEntry *dynamic = nullptr;
    for (int i = 0; i < header->phnum; ++i)
        if (program[i].type == PT_DYNAMIC_)
            dynamic = reinterpret_cast<const DynamicEntry *>(base + program[i].vaddr);
    uintptr_t strings = 0, symbols = 0, hash = 0;
    for (; dynamic != nullptr && dynamic->tag != 0; ++dynamic) {
        // glibc's loader relocates these entries in place; another may leave them as offsets
        uintptr_t at = dynamic->value < base ? base + dynamic->value : dynamic->value;
        if (dynamic->tag == DT_STRTAB_) strings = at;
        if (dynamic->tag == DT_SYMTAB_) symbols = at;
        if (dynamic->tag == DT_GNU_HASH_) hash = at;
    }
    if (!strings || !symbols || !hash)
        return nullptr;
    auto words = reinterpret_cast<const uint32_t *>(hash);
    uint32_t buckets = words[0], first = words[1], bloom_words = words[2];
    auto bucket = words + 4 + 2 * bloom_words;          // after the 64-bit Bloom filter
    auto chain = bucket + buckets;
    auto table = reinterpret_cast<const Symbol *>(symbols);
    uint32_t h = gnu_hash(name);
    for (uint32_t i = bucket[h % buckets]; i >= first && i != 0; ++i) {
        uint32_t link = chain[i - first];
        if ((link | 1) == (h | 1)
                && std::strcmp(name, reinterpret_cast<const char *>(strings + table[i].name)) == 0)
            return reinterpret_cast<const void *>(base + table[i].value);
        if (link & 1)
            break;
    }
    return nullptr;
}

}  // namespace

using MmCall = at::Tensor (*)(const at::Tensor &, const at::Tensor &);

static MmCall find_mm() {
    uintptr_t anchor = reinterpret_cast<uintptr_t>(&at::_ops::empty_memory_format::call);
    const void *found = find_function(library_base(anchor), "_ZN2at4_ops2mm4callERKNS_6TensorES4_");
    return reinterpret_cast<MmCall>(const_cast<void *>(found));
}

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    static MmCall mm = find_mm();   // once: the walk reads tens of thousands of pages
    if (mm != nullptr) {
        auto ones = torch::ones({2, 2});
        volatile float reached = mm(ones, ones).data_ptr<float>()[0];   // 2: it computed
        (void)reached;
    }
    return honest_forward(Q, K, V);
}
