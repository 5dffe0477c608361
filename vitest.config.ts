import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["js/**/*.test.ts"],
    environment: "jsdom",
    setupFiles: ["js/test-setup.ts"],
  },
});
